# frozen_string_literal: true

require "mkmf"

abort "serval needs Linux (epoll)" unless have_header("sys/epoll.h")
have_header("sys/eventfd.h") or abort "serval needs sys/eventfd.h"
have_header("sys/sendfile.h") or abort "serval needs sys/sendfile.h"
have_func("accept4", "sys/socket.h")
have_library("pthread")
# TLS (tls.c) when OpenSSL's headers and libraries are present; without them
# the build succeeds and an ssl:// bind fails at boot with a clear message.
if have_header("openssl/ssl.h") && have_library("crypto", "ERR_get_error") &&
   have_library("ssl", "SSL_CTX_new")
  have_func("SSL_has_pending", "openssl/ssl.h")
else
  $defs.delete("-DHAVE_OPENSSL_SSL_H")
end
# GVL instrumentation (gvl.c): the event hook is Ruby 3.2+, thread-specific
# storage for it 3.3+. Without them only CPU and wall time are measured.
if have_header("ruby/thread.h")
  have_func("rb_internal_thread_add_event_hook", "ruby/thread.h")
  have_func("rb_internal_thread_specific_get", "ruby/thread.h")
end
# Lock waits told from I/O (gvl.c): another thread's frames, 3.3+.
have_func("rb_profile_thread_frames", "ruby/debug.h") if have_header("ruby/debug.h")
# The env filled in place (env.c): a Hash's table and st_foreach_with_replace,
# public since 2.7; without them every env is built the plain way.
have_func("rb_hash_tbl", "ruby.h") && have_func("rb_st_foreach_with_replace", "ruby.h")
# Fairness (fairness.c): a postponed job triggered from a native thread, 3.3+.
have_func("rb_postponed_job_trigger", "ruby/debug.h") if have_header("ruby/debug.h")

$CFLAGS << " -std=gnu11 -O2 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers"
# Warnings are errors where the code is developed and tested (`rake compile`
# sets SERVAL_WERROR; CI uses it), not in a user's `gem install`, where a newer
# compiler's new warning must not stop the install.
$CFLAGS << " -Werror" if ENV["SERVAL_WERROR"] && !ENV["SERVAL_NO_WERROR"]
$CFLAGS << " #{ENV['SERVAL_EXTRA_CFLAGS']}" if ENV["SERVAL_EXTRA_CFLAGS"]
$LDFLAGS << " #{ENV['SERVAL_EXTRA_LDFLAGS']}" if ENV["SERVAL_EXTRA_LDFLAGS"]

# Every ext/serval/*.c is compiled (errlog.c included); after adding a file,
# the Makefile under tmp/ is regenerated because this file changed.
create_makefile("serval/serval_ext")
