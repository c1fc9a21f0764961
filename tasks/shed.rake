# frozen_string_literal: true

# C-level tests of load shedding's decision (ext/serval/shed.c), added to
# `rake test:c` beside the parser's. Loaded by the main Rakefile.

SHED_FLAGS = %w[-std=gnu11 -g -O1 -Wall -Wextra -Werror
                -fsanitize=address,undefined -fno-sanitize-recover=undefined
                -fno-omit-frame-pointer -Iext/serval].freeze

namespace :test do
  desc "Build and run the C tests (parser, load shedding) with ASan/UBSan"
  task :c do
    mkdir_p "tmp"
    sh ENV.fetch("CC", "gcc"), *SHED_FLAGS, "ext/serval/shed.c", "test/c/test_shed.c", "-lm", "-o", "tmp/test_shed"
    sh "tmp/test_shed"
  end
end

namespace :test do
  # The window's slot of a figure (ext/serval/winslot.h) against frexp.
  task :c do
    sh ENV.fetch("CC", "gcc"), *SHED_FLAGS, "test/c/test_winslot.c", "-lm", "-o", "tmp/test_winslot"
    sh "tmp/test_winslot"
  end
end
