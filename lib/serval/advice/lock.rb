# frozen_string_literal: true

require "serval/advice/simulation"

module Serval
  module Advice
    # Waits for a Ruby lock (Thread::Mutex, Monitor - Logger's -,
    # ConditionVariable, Queue), measured apart from I/O on Ruby 3.3+
    # (Timing#lock, ext/serval/gvl.c). Not I/O: I/O overlaps freely with
    # other threads' work, a lock serialises its holders, and its holder
    # must get the GVL back before it can let go - so the longer the GVL's
    # queue (more threads), the longer the lock is held and the longer the
    # next thread waits for it. Like the database pool (Simulation's `pool`),
    # it is a local resource the Simulation plays for each thread count
    # (its `lock`), not a time each request brings along.
    #
    # What a request does while holding the lock is not measured (that
    # would take wrapping the lock's methods). The model holds one lock
    # through a share of the requests' waits (Logger: its write to the
    # file) and until the GVL comes back, and picks the share whose
    # simulated lock waits, at the window's thread count and rate, come
    # closest to the measured ones (#calibrate).
    module Lock
      SHARES = [1 / 32.0, 1 / 16.0, 1 / 8.0, 1 / 4.0, 1 / 2.0, 1.0].freeze
      MIN_SHARE = 0.01   # lock waits below this share of the requests' wall time: not modelled
      REQUESTS = 4_000   # requests per calibration run
      NEAR = 0.5         # a share whose simulated waits are within a factor e^NEAR of the measured reproduces them

      module_function

      # The window's measured lock waits and what the model makes of them:
      # { measured_mean:, share_of_wall:, threads:, rate:, share:, simulated_mean:, reproduced: }
      # (share nil: not modelled - too small, no thread count to calibrate
      # at, or nothing measured). workload: without the lock.
      def calibrate(workload, window, quantum:, handoff: 0.0, seed: 1)
        measured = window.mean(:lock)
        return nil unless measured&.positive?

        wall = window.mean(:wall)
        out = { measured_mean: measured.round(6), share_of_wall: wall&.positive? ? (measured / wall).round(4) : nil,
                threads: window.max_threads, rate: window.rate_per_process&.round(2), share: nil,
                simulated_mean: nil, reproduced: nil }
        return out if out[:share_of_wall] && out[:share_of_wall] < MIN_SHARE
        return out unless window.max_threads && window.max_threads >= 2

        profiles = workload.profiles(REQUESTS, Random.new(seed))
        tried = SHARES.map do |q|
          sim = Simulation.new(profiles, quantum: quantum, handoff: handoff, seed: seed, **workload.sim_options, lock: q)
          [q, simulated(sim, window.max_threads, window.rate_per_process, seed)]
        end
        q, got = tried.min_by { |share, mean| distance(mean, measured) }
        out.merge(share: q, simulated_mean: got.round(6), reproduced: distance(got, measured) <= NEAR)
      end

      # Mean lock wait the simulation gives `threads` at `rate` (open loop;
      # saturated when the rate is unknown or above what they serve).
      def simulated(sim, threads, rate, seed)
        closed = sim.closed(threads)
        return closed.lock_wait_mean.to_f unless rate&.positive? && rate < closed.rps

        sim.open(threads, rate: rate, rng: Random.new(seed + 5)).lock_wait_mean.to_f
      end

      def distance(got, measured) = Math.log((got + 1e-7) / (measured + 1e-7)).abs
    end
  end
end
