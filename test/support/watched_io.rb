# frozen_string_literal: true

require "stringio"

module Serval
  # A StringIO for a LogWriter that wakes waiters on each write, so a test can
  # wait for a log line (a handshake) instead of sleeping.
  class WatchedIO < StringIO
    def initialize
      super
      @mutex = Mutex.new
      @cond = ConditionVariable.new
    end

    def write(*args)
      @mutex.synchronize do
        n = super
        @cond.broadcast
        n
      end
    end

    # Returns the MatchData of the first match of pattern (a Regexp or String).
    def wait_for(pattern, timeout: 5)
      pattern = Regexp.new(Regexp.escape(pattern)) if pattern.is_a?(String)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      @mutex.synchronize do
        loop do
          match = string.match(pattern)
          return match if match

          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise "no #{pattern.inspect} within #{timeout}s in:\n#{string}" if left <= 0

          @cond.wait(@mutex, left)
        end
      end
    end
  end
end
