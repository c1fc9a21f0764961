# frozen_string_literal: true

module Serval
  # JSON has no Infinity or NaN (a histogram's last bucket ends at +Inf).
  # JSONSafe.convert copies Hashes and Arrays deeply and puts what the block
  # returns in place of each non-finite Float: the control app sends
  # "+Inf"-style strings, a worker's check-in sends nil.
  #
  #   Serval::JSONSafe.convert({ le: [0.1, Float::INFINITY] }) { nil } # => { le: [0.1, nil] }
  module JSONSafe
    def self.convert(value, &replace)
      case value
      when Hash then value.transform_values { |v| convert(v, &replace) }
      when Array then value.map { |v| convert(v, &replace) }
      when Float then value.finite? ? value : replace.call(value)
      else value
      end
    end
  end
end
