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
    # Returns {rps: [...], stall: [...], requests:, cpu_share:} or nil when
    # the window holds fewer than MIN_SAMPLES measured requests.
    module Model
      REQUESTS = 3000     # simulated requests per thread count
      MIN_SAMPLES = 200   # measured requests needed
      SEED = 7

      module_function

      def call(window, max:)
        w = window.is_a?(Advice::Window) ? window : Advice::Window.new(window)
        return nil if w.measured < MIN_SAMPLES

        workload = corrected(w, w.workload)
        return nil unless (workload.mean_run + workload.mean_io).positive?

        sim = Advice::Simulation.new(workload.profiles(REQUESTS, Random.new(SEED)),
                                     quantum: w.timeslice || Advice::Simulation::QUANTUM, handoff: w.handoff)
        rows = (1..max).map { |t| sim.closed(t) }
        { rps: rows.map(&:rps), stall: rows.map(&:stall_mean), requests: w.requests,
          cpu_share: workload.cpu_share }
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
