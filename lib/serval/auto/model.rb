# frozen_string_literal: true

require "serval/advice"

module Serval
  module Auto
    # The controller's prediction: closed-loop req/s and mean stall for 1..max
    # threads, from a window of this process's requests (Timing::Window.read)
    # played through Serval::Advice's simulation. The same model as
    # `servalctl advise`, run smaller (REQUESTS simulated per point, no load
    # points, no machine facts), so one call costs tens of milliseconds of
    # Ruby, not seconds; the tuner runs it every few intervals in its own
    # low-priority thread, never on a request.
    #
    # With `rate:` (the arrival rate the process measures, req/s) it also
    # predicts the p99 latency, queue included, of open (Poisson) arrivals at
    # that rate plus `headroom` (HEADROOM: 10 % more; `p99:`,
    # Float::INFINITY where the count cannot keep up): what the controller
    # minimises at part load, where closed-loop throughput says nothing
    # about which count answers fastest. The headroom is there because p99
    # near a count's capacity climbs steeply with the load (as 1 / (1 - load)
    # and faster), and the model's capacity per count errs by a few per cent
    # (bench/NOTES.md "Concurrency advice (issue 9)": max req/s -4 to +5 %), mostly low
    # at the top: at the measured rate the counts a few per cent apart in
    # capacity come out alike, and the fewest of them - the one nearest its
    # capacity - was chosen where a measured sweep put its p99 1.5x the
    # best's (bench/NOTES.md "threads :auto", "to the lowest predicted p99 at
    # part load"). At 10 % more arrivals a count
    # with too little room shows it, and one with room to spare is not
    # charged: its p99 moves little. If no count keeps up with the higher
    # rate, the measured rate is used. To keep a
    # run short (it is Ruby that requests wait behind) the counts are
    # simulated upward from the first that keeps up and no further than two
    # past the lowest p99 once two in a row came out worse, but always
    # through `through` (the count running); the rest are nil (not simulated).
    #
    # Returns {rps: [...], stall: [...], p99: [...] or nil, rate: (measured),
    # p99_rate: (the rate p99 is for), requests:, cpu_share:} or nil when
    # the window holds fewer than MIN_SAMPLES measured requests.
    module Model
      REQUESTS = 3000     # simulated requests per thread count
      MIN_SAMPLES = 200   # measured requests needed
      SEED = 7
      OPEN_ROOM = 1.02    # a count must serve this much more than the arrival rate to be simulated open
      HEADROOM = 0.1      # open-loop p99 is predicted at this much more than the measured rate

      module_function

      def call(window, max:, rate: nil, through: nil, headroom: HEADROOM)
        w = window.is_a?(Advice::Window) ? window : Advice::Window.new(window)
        return nil if w.measured < MIN_SAMPLES

        workload = corrected(w, w.workload)
        return nil unless (workload.mean_run + workload.mean_io).positive?

        sim = Advice::Simulation.new(workload.profiles(REQUESTS, Random.new(SEED)),
                                     quantum: w.timeslice || Advice::Simulation::QUANTUM, handoff: w.handoff,
                                     speed: w.replayed_speed, # open-loop p99 replays the measured CPU speed
                                     **workload.sim_options)
        rows = (1..max).map { |t| sim.closed(t) }
        at = open_rate(rows, rate, headroom)
        { rps: rows.map(&:rps), stall: rows.map(&:stall_mean), p99: open_p99(sim, rows, at, through.to_i), rate: rate,
          p99_rate: at, requests: w.requests, cpu_share: workload.cpu_share }
      end

      # The rate open-loop p99 is predicted at: rate x (1 + headroom), or the
      # rate itself when no count would keep up with that (at or near
      # saturation, where the closed-loop rules decide anyway).
      def open_rate(rows, rate, headroom)
        return rate unless rate&.positive? && headroom.to_f.positive?

        higher = rate * (1 + headroom)
        rows.any? { |r| r.rps > higher * OPEN_ROOM } ? higher : rate
      end

      # p99 latency of Poisson arrivals at `rate` for each count, the same
      # arrivals for every count (common random numbers); a count whose
      # closed-loop req/s does not exceed the rate by OPEN_ROOM cannot keep up.
      def open_p99(sim, rows, rate, through)
        return nil unless rate&.positive?

        best = Float::INFINITY
        worse = 0
        rows.map do |r|
          next Float::INFINITY unless r.rps > rate * OPEN_ROOM
          next nil if worse >= 2 && r.threads > through

          p99 = sim.open(r.threads, rate: rate, rng: Random.new(SEED)).latency_p99
          worse = p99 > best ? worse + 1 : 0
          best = p99 if p99 < best
          p99
        end
      end

      # Ruby 3.1: the waits hold the stall too; take the model's estimate out
      # (as Advice::Recommender does).
      def corrected(w, workload)
        return workload if w.gvl_split? || !w.seconds&.positive? || !w.max_threads || w.max_threads < 2

        Advice::StallEstimate.call(workload, threads: w.max_threads, rate: w.rate_per_process,
                                             requests: REQUESTS / 2, seed: SEED).first
      end
    end
  end
end
