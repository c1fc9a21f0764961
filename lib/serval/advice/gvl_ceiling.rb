# frozen_string_literal: true

module Serval
  module Advice
    # Puma's rule of thumb for one process: only one thread holds the GVL, so
    # a request of R seconds that holds it for a share f of R caps the
    # process at 1 / (R x f) req/s, and with constant service times
    # ceil(1 / f) threads reach that cap. Random service times and bursts of
    # I/O need more threads to get near it; the Simulation shows how many.
    module GvlCeiling
      # R = mean run + mean io of a request (seconds), f = run / R.
      # Without measurable run the GVL sets no ceiling: max_rps and threads nil.
      def self.call(mean_run, mean_io)
        raise ArgumentError, "mean run and io must be >= 0" if mean_run.negative? || mean_io.negative?
        return { cpu_share: 0.0, max_rps: nil, threads: nil } unless mean_run.positive?

        share = mean_run / (mean_run + mean_io)
        { cpu_share: share.round(4), max_rps: (1.0 / mean_run).round(2),
          threads: ((1.0 / share) - 1e-9).ceil }
      end
    end
  end
end
