# frozen_string_literal: true

# C-level tasks for the HTTP parser (ext/serval/parser.c).
# Loaded by the main Rakefile via Dir["tasks/*.rake"].

PARSER_SRC = "ext/serval/parser.c"
PARSER_HDR = "ext/serval/parser.h"
PARSER_CC = ENV.fetch("CC", "gcc")
PARSER_CLANG = ENV.fetch("FUZZ_CC", "clang-14")
PARSER_SAN_FLAGS = %w[-std=gnu11 -g -O1 -Wall -Wextra -Werror
                      -fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -Iext/serval].freeze

namespace :test do
  desc "Build and run the C parser unit tests with ASan/UBSan"
  task :c do
    mkdir_p "tmp"
    sh PARSER_CC, *PARSER_SAN_FLAGS, PARSER_SRC, "test/c/test_parser.c", "-o", "tmp/test_parser"
    sh "tmp/test_parser"
  end
end

desc "Run the libFuzzer parser target for FUZZ_SECONDS (default 60) with clang-14"
task :fuzz do
  mkdir_p "tmp"
  mkdir_p "tmp/fuzz_corpus"
  seconds = Integer(ENV.fetch("FUZZ_SECONDS", "60"))
  sh PARSER_CLANG, "-std=gnu11", "-g", "-O1", "-Iext/serval",
     "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
     PARSER_SRC, "fuzz/fuzz_parser.c", "-o", "tmp/fuzz_parser"
  # new findings go to tmp/fuzz_corpus; fuzz/corpus holds the curated seeds
  sh "tmp/fuzz_parser", "-max_total_time=#{seconds}", "-max_len=4096",
     "-artifact_prefix=tmp/", "tmp/fuzz_corpus", "fuzz/corpus"
end

namespace :fuzz do
  desc "Replay fuzz/corpus through the fuzz target without libFuzzer (gcc, ASan/UBSan)"
  task :replay do
    mkdir_p "tmp"
    sh PARSER_CC, *PARSER_SAN_FLAGS, "-DSV_FUZZ_STANDALONE", PARSER_SRC, "fuzz/fuzz_parser.c",
       "-o", "tmp/fuzz_replay"
    files = Dir["fuzz/corpus/*"].select { |f| File.file?(f) }.sort
    sh "tmp/fuzz_replay", *files
  end
end
