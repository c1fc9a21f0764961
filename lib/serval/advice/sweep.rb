# frozen_string_literal: true

require "serval/advice/simulation"

module Serval
  module Advice
    # Closed-loop throughput for 1..max threads on the same requests, and the
    # knee: the fewest threads whose req/s reaches `fraction` (95 %) of the
    # best in the sweep.
    #
    # The sweep stops early (after at least MIN_ROWS rows, and TAIL rows past
    # the knee) once the rows left cannot move the knee: closed-loop req/s
    # grows by less and less with each thread, so the rest of the sweep adds
    # at most (max - n) x the larger of the last two gains to the best; when
    # even that stays below knee / fraction, the knee is final. Rows past the
    # stop are simulated when asked for (#at), so a thread count the advice
    # names (running threads, the pool's size) always has its row.
    class Sweep
      MIN_ROWS = 8
      TAIL = 3

      attr_reader :rows, :max

      def initialize(simulation, max:, fraction:, early_stop: true)
        raise ArgumentError, "fraction must be within (0, 1]" unless fraction.positive? && fraction <= 1

        @simulation = simulation
        @fraction = fraction
        @max = max
        @rows = []
        (1..max).each do |t|
          @rows << simulation.closed(t)
          break if early_stop && settled?
        end
      end

      def best = @rows.map(&:rps).max
      def knee = @rows.find { |r| r.rps >= @fraction * best }.threads
      # Whether the sweep stopped before max (rows past it were not simulated).
      def stopped_early? = @rows.size < @max

      def at(threads)
        @rows << @simulation.closed(@rows.size + 1) while @rows.size < threads
        @rows[threads - 1]
      end

      # The table servalctl advise prints: predicted req/s, gain over one
      # thread fewer, stall and latency at saturation.
      def table
        @rows.each_with_index.map do |r, i|
          gain = i.zero? ? nil : ((r.rps / @rows[i - 1].rps) - 1).round(4)
          { threads: r.threads, rps: r.rps.round(2), gain: gain, stall_mean: r.stall_mean.round(6),
            wall_p50: r.wall_p50.round(6), wall_p99: r.wall_p99.round(6), gvl_busy: r.gvl_busy.round(4) }
        end
      end

      private

      def settled?
        n = @rows.size
        return false if n < MIN_ROWS || n >= @max

        k = knee
        return false if n < k + TAIL

        gains = [@rows[-1].rps - @rows[-2].rps, @rows[-2].rps - @rows[-3].rps, 0.0]
        bound = best + ((@max - n) * gains.max)
        @fraction * bound < @rows[k - 1].rps
      end
    end
  end
end
