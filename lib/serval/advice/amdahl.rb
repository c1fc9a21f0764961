# frozen_string_literal: true

module Serval
  module Advice
    # Amdahl's law as the background articles apply it to threads: with p the
    # I/O share of a request, n threads speed it up by 1 / ((1 - p) + p / n).
    # Their rule stops adding threads when one more gains less than 5 %.
    #
    # Shown as an explanation beside the model, never used as the answer:
    # Amdahl's law is about one task split n ways, while a server runs many
    # independent requests, whose throughput the GVL caps (see GvlCeiling).
    module Amdahl
      MIN_GAIN = 0.05

      def self.speedup(io_share, threads)
        1.0 / ((1.0 - io_share) + (io_share / threads))
      end

      # [{threads:, speedup:, gain:}] for 1..max; gain is over one thread
      # fewer (nil for 1).
      def self.table(io_share, max: 16)
        check(io_share)
        (1..max).map do |n|
          s = speedup(io_share, n)
          { threads: n, speedup: s.round(4), gain: n == 1 ? nil : ((s / speedup(io_share, n - 1)) - 1).round(4) }
        end
      end

      # The articles' pick: the largest thread count whose gain over one
      # fewer is still >= min_gain (p = 0.45 -> 4: +6 % at 4, +3 % at 5).
      def self.pick(io_share, min_gain: MIN_GAIN, max: 64)
        check(io_share)
        n = 1
        n += 1 while n < max && (speedup(io_share, n + 1) / speedup(io_share, n)) - 1 >= min_gain
        n
      end

      def self.check(io_share)
        raise ArgumentError, "io_share must be within 0..1" unless io_share.is_a?(Numeric) && io_share.between?(0, 1)
      end
    end
  end
end
