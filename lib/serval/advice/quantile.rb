# frozen_string_literal: true

module Serval
  module Advice
    # The q-quantile (0..1) of an ascending Array, linearly interpolated; nil
    # for an empty one.
    def self.quantile(sorted, q)
      return nil if sorted.empty?

      lo, hi, weight = quantile_ranks(sorted.size, q)
      interpolate(sorted[lo], sorted[hi], weight)
    end

    # The ranks (0: the least) of the two values the q-quantile of `size`
    # values lies between, and the weight of the upper one.
    def self.quantile_ranks(size, q)
      pos = q * (size - 1)
      lo = pos.floor
      [lo, pos.ceil, pos - lo]
    end

    def self.interpolate(lower, upper, weight) = lower + ((upper - lower) * weight)
  end
end
