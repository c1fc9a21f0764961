# frozen_string_literal: true

module Serval
  module Advice
    # Open-loop predictions from the same model: latency at a given load,
    # and the fleet a target req/s needs.
    module Capacity
      # p50 / p99 of latency (queue for a thread + time in the app), mean
      # stall and queue, for `rate` req/s arriving at one process.
      def self.at(simulation, threads:, rate:, rng:)
        r = simulation.open(threads, rate: rate, rng: rng)
        { rate: rate.round(2), latency_p50: r.latency_p50.round(6), latency_p99: r.latency_p99.round(6),
          stall_mean: r.stall_mean.round(6), queue_mean: r.queue_mean.round(6) }
      end

      # machines x processes x threads for target_rps, each process run at
      # no more than `utilization` of its max req/s, and the predicted
      # latency there.
      def self.plan(simulation, target_rps:, threads:, max_rps:, processes:, utilization:, rng:)
        raise ArgumentError, "target_rps must be > 0" unless target_rps.positive?

        total = (target_rps / (max_rps * utilization)).ceil
        machines = (total.to_f / processes).ceil
        rate = target_rps / (machines * processes)
        at(simulation, threads: threads, rate: rate, rng: rng).merge(
          target_rps: target_rps, machines: machines, processes: processes, threads: threads,
          utilization: (rate / max_rps).round(4)
        )
      end
    end
  end
end
