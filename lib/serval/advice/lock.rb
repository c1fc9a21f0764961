# frozen_string_literal: true

require "serval/advice/simulation"
require "serval/advice/workload"

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
    # through a share of the requests' waits and until the GVL comes back.
    # Two kinds of holder are tried: one that holds it through sends only
    # (waits of at most SEND_MAX, the hook's own bound for a write - a
    # logger, whose lock covers its write to the file or pipe), and one
    # that may hold it through any wait (a Mutex around a database call).
    # Each with each share in SHARES is played at the window's thread
    # count and its rate while loaded, and #calibrate keeps the one whose
    # simulated lock waits come closest to the measured ones: their mean
    # and, when the window has samples, the share of requests that waited
    # at all. The mean alone cannot tell them apart: a lock held rarely through long
    # waits and one held often through short writes give the same mean,
    # but the first makes a few requests wait long and caps throughput,
    # the second makes most wait briefly (Rails with its logger: 63 % of
    # requests waited, p50 0.24 ms - bench/NOTES.md "Session 29").
    module Lock
      SHARES = [1 / 32.0, 1 / 16.0, 1 / 8.0, 1 / 4.0, 1 / 2.0, 1.0].freeze
      MIN_SHARE = 0.01   # lock waits below this share of the requests' wall time: not modelled
      REQUESTS = 4_000   # requests per calibration run
      SEND_MAX = Workload::LINK_SEND_MAX # the longest wait a "sends only" holder keeps the lock through
      HELD = { sends: SEND_MAX, any: nil }.freeze
      KEEP_UP = 0.97     # an open run that served less than this share of the rate fell behind: saturated instead
      NEAR = 0.5         # a share whose simulated waits are within a factor e^NEAR of the measured reproduces them

      module_function

      # The window's measured lock waits and what the model makes of them:
      # { measured_mean:, share_of_wall:, measured_waited:, threads:, rate:, share:, held:, within:,
      #   simulated_mean:, simulated_waited:, reproduced: }
      # (share nil: not modelled - too small, no thread count to calibrate
      # at, or nothing measured; held: :sends or :any, within its bound in
      # seconds or nil). workload: without the lock.
      def calibrate(workload, window, quantum:, handoff: 0.0, seed: 1)
        measured = window.mean(:lock)
        return nil unless measured&.positive?

        wall = window.mean(:wall)
        waited = window.positive_share(:lock)
        out = { measured_mean: measured.round(6), share_of_wall: wall&.positive? ? (measured / wall).round(4) : nil,
                measured_waited: waited&.round(4), threads: window.max_threads, rate: window.loaded_rate_per_process&.round(2),
                share: nil, held: nil, within: nil, simulated_mean: nil, simulated_waited: nil, reproduced: nil }
        return out if out[:share_of_wall] && out[:share_of_wall] < MIN_SHARE
        return out unless window.max_threads && window.max_threads >= 2

        profiles = workload.profiles(REQUESTS, Random.new(seed))
        tried = HELD.flat_map do |held, within|
          runs = []
          SHARES.each do |q| # the distance falls, then rises with the share: stop once it rises
            sim = Simulation.new(profiles, quantum: quantum, handoff: handoff, seed: seed, **workload.sim_options,
                                           lock: q, lock_within: within)
            runs << [held, q, simulated(sim, window.max_threads, window.loaded_rate_per_process, seed)]
            break if runs.size >= 2 && distance(runs[-1][2], measured, waited) > distance(runs[-2][2], measured, waited)
          end
          runs
        end
        held, q, got = tried.min_by { |_, _, r| distance(r, measured, waited) }
        out.merge(share: q, held: held, within: HELD[held], simulated_mean: got.lock_wait_mean.to_f.round(6),
                  simulated_waited: got.lock_waited.to_f.round(4),
                  reproduced: distance(got, measured, waited) <= NEAR * (waited ? 2 : 1))
      end

      # The simulation's run for `threads` at `rate` (open loop), or
      # saturated when the rate is unknown or more than they keep up with.
      def simulated(sim, threads, rate, seed)
        return sim.closed(threads) unless rate&.positive?

        open = sim.open(threads, rate: rate, rng: Random.new(seed + 5))
        open.rps >= KEEP_UP * rate ? open : sim.closed(threads)
      end

      # How far a run's lock waits are from the measured ones: the log
      # ratio of the means, plus that of the shares that waited when known.
      def distance(result, measured, waited = nil)
        d = ratio(result.lock_wait_mean.to_f, measured)
        waited ? d + ratio(result.lock_waited.to_f, waited) : d
      end

      def ratio(got, measured) = Math.log((got + 1e-7) / (measured + 1e-7)).abs
    end
  end
end
