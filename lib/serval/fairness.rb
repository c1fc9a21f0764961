# frozen_string_literal: true

require "serval/errors"
require "serval/native_ext"

module Serval
  # Fairness between CPU- and I/O-bound requests (docs/tuning.md): a request
  # thread that computes gives the GVL to a waiting thread after
  # `fair_timeslice` milliseconds instead of Ruby's 100 ms time slice.
  #
  # Ruby 3.3+: ext/serval/fairness.c preempts a request thread that has held
  # the GVL for the slice while another thread waits (mode :preempt).
  # Ruby 3.1/3.2: request threads get the Thread#priority whose Ruby slice is
  # closest to the setting from below (mode :priority); what that buys depends
  # on the Ruby (bench/NOTES.md "Fairness between CPU- and I/O-bound requests"
  # has the measured figures).
  #
  # The setting is per process, as the GVL is: Server#run starts it (Part),
  # each request thread calls apply as it starts (a before_thread_start hook).
  module Fairness
    # The Server part (ServerParts) for fair_timeslice > 0: the process's
    # slice set as the server starts (before its request threads), each
    # request thread marked (or given its priority) as it starts.
    class Part
      def self.attach(server, options, _log_writer)
        new(options[:fair_timeslice]).tap do
          server.thread_pool.add_hook(:before_thread_start, -> { Fairness.apply(Thread.current) }, first: true)
        end
      end

      def initialize(ms)
        @ms = ms
      end

      def start
        @mode = Fairness.start(@ms)
        self
      end

      def stop = Fairness.stop
      def effective_slice = Fairness.effective_slice
      def stats = @mode == :preempt ? { fair_preemptions: Fairness.preemptions } : {}
    end

    RUBY_SLICE_MS = 100.0 # Ruby's time slice at priority 0 (thread.c TIME_QUANTUM)
    MIN_PRIORITY = -3     # Thread#priority's floor; each step down halves the slice
    # The slice `fair_timeslice true` means. Off by default: on a CPU-bound
    # page every request waits for the GVL, and switching every 2 ms cost
    # 3-12 % of Campfire's throughput (bench/NOTES.md, bench/cost_parts).
    DEFAULT_SLICE_MS = 2.0

    @slice_ms = 0.0

    class << self
      attr_reader :slice_ms

      # :preempt, :priority or :off for a setting of ms milliseconds (0: off).
      def mode(ms = @slice_ms)
        return :off unless ms.to_f.positive?

        supported? ? :preempt : :priority
      end

      def supported?
        Native::Fairness.supported?
      end

      # This process's setting; starts (or stops) the native part.
      def start(ms)
        @slice_ms = ms.to_f
        if mode == :preempt
          Native::Fairness.start(@slice_ms / 1000.0)
        elsif supported?
          Native::Fairness.stop
        end
        mode
      end

      def stop
        Native::Fairness.stop if supported?
        @slice_ms = 0.0
      end

      # A request thread as it starts: marked for preemption, or given the
      # priority; untouched when off.
      def apply(thread)
        case mode
        when :preempt then Native::Fairness.mark(thread, true)
        when :priority then thread.priority = priority_for(@slice_ms)
        end
        thread
      end

      # Whether thread runs with the shorter slice (tests, stats).
      def applied?(thread)
        case mode
        when :preempt then Native::Fairness.marked?(thread)
        when :priority then thread.priority == priority_for(@slice_ms)
        else false
        end
      end

      # The highest Thread#priority whose Ruby slice (100 ms >> -priority) is
      # at most ms, but not below -3: 12.5 ms (-3) for anything up to 12.5.
      def priority_for(ms)
        priority = 0
        priority -= 1 while priority > MIN_PRIORITY && RUBY_SLICE_MS / (2**-priority) > ms
        priority
      end

      # Times a request thread gave the GVL away at the end of its slice (Ruby 3.3+; nil otherwise).
      # Seconds a request thread may keep the GVL from a waiting one: the
      # slice with :preempt, Ruby's slice at the priority given with
      # :priority; nil when off (Ruby's own 100 ms).
      def effective_slice
        case mode
        when :preempt then @slice_ms / 1000.0
        when :priority then RUBY_SLICE_MS / (2**-priority_for(@slice_ms)) / 1000.0
        end
      end

      def preemptions
        Native::Fairness.stats[:preemptions] if supported?
      end

      # The option's value: milliseconds in min..max, or 0 for off (false,
      # "off" and "false" mean 0; true means the default).
      def coerce(name, value, min, max, default)
        value = default if value == true
        return 0.0 if value.nil? || value == false || %w[off false].include?(value.to_s.strip.downcase)

        ms = if value.is_a?(Numeric) && value.to_f.finite? then value.to_f
             elsif value.is_a?(String) && value.strip.match?(/\A\d+(\.\d+)?\z/) then Float(value.strip)
             else raise ConfigError, "#{name}: expected milliseconds (#{min}..#{max}) or false, got #{value.inspect}"
             end
        return 0.0 if ms.zero?
        raise ConfigError, "#{name}: must be 0 (off) or >= #{min} ms (got #{value})" if ms < min
        raise ConfigError, "#{name}: must be <= #{max} ms (got #{value})" if ms > max

        ms
      end
    end
  end
end
