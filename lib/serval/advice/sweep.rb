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
    #
    # `near`: a knee found before on nearly the same requests (the advice's
    # own, for the same requests a few per cent slower or faster): only the
    # knee is wanted, so the sweep starts one row below it and walks down a
    # row at a time only while its lowest row still reaches the fraction.
    # Below the knee req/s rises with threads, so the rows skipped could
    # not have been the knee; the stopping rule is the same (MIN_ROWS,
    # TAIL, the gains bound), so it ends where the sweep from one thread
    # would and finds the same best and knee (test/advice/sweep_near_test.rb).
    class Sweep
      MIN_ROWS = 8
      TAIL = 3

      attr_reader :max

      def initialize(simulation, max:, fraction:, early_stop: true, near: nil)
        raise ArgumentError, "fraction must be within (0, 1]" unless fraction.positive? && fraction <= 1

        @simulation = simulation
        @fraction = fraction
        @max = max
        @low = near ? (near - 1).clamp(1, max) : 1 # the lowest row simulated
        @by = {} # threads => row
        (@low..max).each do |t|
          @by[t] = simulation.closed(t)
          break if early_stop && settled?
        end
        while @low > 1 && knee == @low
          @low -= 1
          @by[@low] = simulation.closed(@low)
        end
      end

      # The rows simulated, by thread count (from 1 unless `near`).
      def rows = @by.keys.sort.map { |t| @by[t] }

      def best = @by.each_value.map(&:rps).max
      def knee = rows.find { |r| r.rps >= @fraction * best }.threads
      # The fewest threads reaching `share` of the best req/s (the knee at
      # another fraction; 0.99: where a flat top really levels off), rows
      # past the stop simulated as needed. The best is the rows' simulated
      # by then: a row added later that beats it does not move the answer
      # back, so on a still rising curve this is a lower bound.
      def fewest(share)
        raise ArgumentError, "share must be within (0, 1]" unless share.positive? && share <= 1

        t = share >= @fraction ? knee : @low
        t += 1 while t < @max && at(t).rps < share * best
        t
      end

      # Whether the sweep stopped before max (rows past it were not simulated).
      def stopped_early? = top < @max

      def at(threads)
        @by[top + 1] = @simulation.closed(top + 1) while top < threads
        @by[threads] ||= @simulation.closed(threads)
      end

      # The table servalctl advise prints: predicted req/s, gain over one
      # thread fewer, stall and latency at saturation.
      def table
        list = rows
        list.each_with_index.map do |r, i|
          gain = i.zero? ? nil : ((r.rps / list[i - 1].rps) - 1).round(4)
          row = { threads: r.threads, rps: r.rps.round(2), gain: gain, stall_mean: r.stall_mean.round(6),
                  wall_p50: r.wall_p50.round(6), wall_p99: r.wall_p99.round(6), gvl_busy: r.gvl_busy.round(4) }
          row[:lock_mean] = r.lock_wait_mean.round(6) if r.lock_wait_mean # with a lock modelled (Simulation)
          row
        end
      end

      private

      def top = @by.keys.max

      def settled?
        n = top
        return false if n < MIN_ROWS || n >= @max

        k = knee
        return false if n < k + TAIL

        last = [n, n - 1, n - 2].map { |t| @by[t].rps }
        gains = [last[0] - last[1], last[1] - last[2], 0.0]
        bound = best + ((@max - n) * gains.max)
        @fraction * bound < @by[k].rps
      end
    end
  end
end
