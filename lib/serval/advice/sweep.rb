# frozen_string_literal: true

require "serval/advice/simulation"

module Serval
  module Advice
    # Closed-loop throughput for 1..max threads on the same requests, and the
    # knee: the fewest threads whose req/s reaches `fraction` (95 %) of the
    # best in the sweep.
    class Sweep
      attr_reader :rows

      def initialize(simulation, max:, fraction:)
        raise ArgumentError, "fraction must be within (0, 1]" unless fraction.positive? && fraction <= 1

        @fraction = fraction
        @rows = (1..max).map { |t| simulation.closed(t) }
      end

      def best = @rows.map(&:rps).max
      def knee = @rows.find { |r| r.rps >= @fraction * best }.threads
      def at(threads) = @rows[threads - 1]

      # The table servalctl advise prints: predicted req/s, gain over one
      # thread fewer, stall and latency at saturation.
      def table
        @rows.each_with_index.map do |r, i|
          gain = i.zero? ? nil : ((r.rps / @rows[i - 1].rps) - 1).round(4)
          { threads: r.threads, rps: r.rps.round(2), gain: gain, stall_mean: r.stall_mean.round(6),
            wall_p50: r.wall_p50.round(6), wall_p99: r.wall_p99.round(6), gvl_busy: r.gvl_busy.round(4) }
        end
      end
    end
  end
end
