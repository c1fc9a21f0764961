# frozen_string_literal: true

require "serval/native_ext"
require "serval/timing"
require "serval/auto/controller"

module Serval
  module Auto
    # Turns the process's running totals into one Measurement per interval:
    # the difference between two reads of Timing.aggregate (the histograms
    # every request already fills in C), the GVL's held time
    # (Native::GVL.global; process CPU time on Ruby 3.1) and the database
    # pools. Reading costs the tuner thread a few microseconds; requests pay
    # nothing.
    class Sampler
      QUEUE = 0 # index of each figure in Timing.aggregate (Timing::Recorder::METRICS, COUNTERS)
      STALL = 3
      LOCK = 6  # only where lock waits are told from I/O (Native::GVL.lock_split?, Ruby 3.3+)

      def initialize(clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
        @clock = clock
        @last = read
      end

      # threads: the thread count the interval ran with; pools: Server#db_pools.
      def sample(threads:, pools: nil)
        now = read
        before = @last
        @last = now
        m = Measurement.new(seconds: now[:at] - before[:at], requests: now[:timed] - before[:timed],
                            threads: threads, gvl: nil)
        return m if m.requests <= 0 || m.seconds <= 0

        slots = now[:bounds].size + 1
        counts = now[:counts].each_with_index.map { |c, i| c - before[:counts][i] }
        m.queue_p90 = self.class.quantile(now[:bounds], counts[QUEUE * slots, slots], 0.9)
        m.queue_mean = (now[:sums][QUEUE] - before[:sums][QUEUE]) / m.requests
        split = Native::GVL.enabled?
        if split
          m.stall_mean = (now[:sums][STALL] - before[:sums][STALL]) / m.requests
          m.stall_p95 = self.class.quantile(now[:bounds], counts[STALL * slots, slots], 0.95)
          m.lock_mean = (now[:sums][LOCK] - before[:sums][LOCK]) / m.requests if lock_split? && now[:sums][LOCK]
        end
        m.wall_mean = (now[:wall] - before[:wall]) / m.requests
        m.gvl = ((now[:held] - before[:held]) / m.seconds).clamp(0.0, 1.0)
        pool = Array(pools).min_by { |p| p[:size].to_i }
        if pool && pool[:size].to_i.positive?
          m.pool = pool[:size].to_i
          m.pool_name = pool[:name]
        end
        m
      end

      # The q-quantile of a histogram (counts per slot, the last above every
      # bound), interpolated within its slot; the top slot reports its bound.
      def self.quantile(bounds, counts, q)
        total = counts.sum
        return 0.0 if total.zero?

        rank = q * total
        seen = 0
        counts.each_with_index do |c, i|
          next if c.zero?

          if seen + c >= rank
            return bounds[-1].to_f if i >= bounds.size

            low = i.zero? ? 0.0 : bounds[i - 1]
            return low + ((bounds[i] - low) * (rank - seen) / c)
          end
          seen += c
        end
        bounds[-1].to_f
      end

      private

      def lock_split? = Native::GVL.lock_split?

      def read
        counts, sums, _cpu, bounds, wall, timed = Timing.aggregate
        global = Native::GVL.global
        held = global ? global[0] / 1e9 : Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
        { at: @clock.call, counts: counts, sums: sums, bounds: bounds, wall: wall, timed: timed, held: held }
      end
    end
  end
end
