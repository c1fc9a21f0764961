# frozen_string_literal: true

require "serval/advice/simulation"

module Serval
  module Advice
    # Ruby 3.1 has no GVL hook, so a request's wait (wall - CPU) holds its
    # I/O and its GVL stall together, and a window recorded at several
    # threads overstates I/O. When the window says how fast requests came
    # (requests / seconds) and at how many threads, the model can estimate
    # the stall at that load and take it out: simulate the load with the
    # waits as measured, shrink the waits by the predicted stall, repeat.
    # An estimate, not a measurement: the caveat stays.
    module StallEstimate
      ROUNDS = 4

      # [workload with the stall taken out of its waits, estimated mean stall]
      def self.call(workload, threads:, rate:, requests:, seed:)
        measured_io = workload.mean_io
        return [workload, 0.0] unless measured_io.positive? && threads > 1

        current = workload
        stall = 0.0
        ROUNDS.times do
          sim = Simulation.new(current.profiles(requests, Random.new(seed)), **current.sim_options)
          # the window's rate can exceed what the inflated waits allow
          # closed; then the process was saturated at `threads`
          saturated = sim.closed(threads)
          result = rate < saturated.rps ? sim.open(threads, rate: rate, rng: Random.new(seed + 4)) : saturated
          stall = [result.stall_mean, measured_io].min
          current = workload.scale_io((measured_io - stall) / measured_io)
        end
        [current, stall]
      end
    end
  end
end
