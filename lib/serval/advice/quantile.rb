# frozen_string_literal: true

module Serval
  module Advice
    # The q-quantile (0..1) of an ascending Array, linearly interpolated; nil
    # for an empty one.
    def self.quantile(sorted, q)
      return nil if sorted.empty?

      pos = q * (sorted.size - 1)
      lo = pos.floor
      hi = pos.ceil
      sorted[lo] + ((sorted[hi] - sorted[lo]) * (pos - lo))
    end
  end
end
