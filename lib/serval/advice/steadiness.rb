# frozen_string_literal: true

module Serval
  module Advice
    # A summary of a window's cpu_speed (the CPU's speed step by step as the
    # GVL's holders saw it, ext/serval/steadiness.c): how many busy steps,
    # the share below 90 % and 75 % of full speed, the 10th percentile and
    # the slowest. nil without figures.
    module Steadiness
      UNSTEADY = 0.05 # a share of steps below 90 % from which advice warns

      module_function

      def call(speeds)
        return nil if speeds.nil? || speeds.empty?

        sorted = speeds.sort
        { steps: speeds.size, below_0_9: share(speeds, 0.9), below_0_75: share(speeds, 0.75),
          p10: Advice.quantile(sorted, 0.1).round(3), min: sorted.first.round(3) }
      end

      def share(speeds, limit) = (speeds.count { |v| v < limit }.to_f / speeds.size).round(4)
    end
  end
end
