# frozen_string_literal: true

require "mkmf"

abort "serval needs Linux (epoll)" unless have_header("sys/epoll.h")
have_header("sys/eventfd.h") or abort "serval needs sys/eventfd.h"
have_header("sys/sendfile.h") or abort "serval needs sys/sendfile.h"
have_func("accept4", "sys/socket.h")
have_library("pthread")

$CFLAGS << " -std=gnu11 -O2 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers"
$CFLAGS << " -Werror" unless ENV["SERVAL_NO_WERROR"]
$CFLAGS << " #{ENV['SERVAL_EXTRA_CFLAGS']}" if ENV["SERVAL_EXTRA_CFLAGS"]
$LDFLAGS << " #{ENV['SERVAL_EXTRA_LDFLAGS']}" if ENV["SERVAL_EXTRA_LDFLAGS"]

create_makefile("serval/serval_ext")
