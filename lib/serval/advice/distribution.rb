# frozen_string_literal: true

module Serval
  module Advice
    # One measured per-request figure (run, idle, pool_wait, ...) in seconds,
    # from raw samples or from histogram buckets, drawn from with a caller's
    # seeded Random so every simulation is reproducible.
    #
    #   Distribution.from([0.012, 0.009, ...])                       # samples
    #   Distribution.from(bounds: [0.001, 0.005, 0.01], counts: [3, 40, 12, 1], sum: 0.41)
    #
    # Histogram counts are per bucket (not cumulative): counts[i] requests
    # fell in (bounds[i-1], bounds[i]]; the last count is above the last
    # bound. A draw picks a bucket by its count and a point uniformly inside
    # it (the top bucket spans bounds[-1]..2 x bounds[-1]); with `sum` given,
    # draws are scaled so their mean is sum / count, the figure a histogram
    # keeps exactly.
    class Distribution
      attr_reader :mean, :count

      def self.from(spec)
        return spec if spec.respond_to?(:draw) && spec.respond_to?(:mean)

        case spec
        when Array then new(spec.map { |v| Float(v) })
        when Hash then histogram(spec)
        when nil then nil
        else raise ArgumentError, "a distribution is an Array of seconds or {bounds:, counts:}, not #{spec.class}"
        end
      end

      def self.histogram(spec)
        bounds = Array(spec[:bounds] || spec["bounds"]).map { |b| Float(b) }
        counts = Array(spec[:counts] || spec["counts"]).map { |c| Integer(c) }
        unless counts.size == bounds.size + 1 && bounds.each_cons(2).all? { |a, b| a < b } && counts.all? { |c| c >= 0 }
          raise ArgumentError, "histogram: counts needs bounds.size + 1 non-negative entries and bounds must ascend"
        end
        sum = spec[:sum] || spec["sum"]
        new(nil, bounds: bounds, counts: counts, sum: sum && Float(sum))
      end

      # A constant, or an exponential with the given mean: for tests and for
      # feeding the model with a configured workload.
      def self.constant(value) = new([Float(value)])

      # (The n draws are scaled so their mean is exactly `mean`.)
      def self.exponential(mean, rng: Random.new(1), n: 4096)
        draws = Array.new(n) { -Math.log(1.0 - rng.rand) }
        scale = mean * n / draws.sum
        new(draws.map { |d| d * scale })
      end

      def initialize(samples, bounds: nil, counts: nil, sum: nil)
        if samples
          raise ArgumentError, "no samples" if samples.empty?
          raise ArgumentError, "samples must be finite and >= 0" unless samples.all? { |s| s.finite? && s >= 0 }

          @samples = samples
          @count = samples.size
          @mean = samples.sum / @count
        else
          init_histogram(bounds, counts, sum)
        end
      end

      def draw(rng)
        return @samples[rng.rand(@count)] if @samples

        pick = rng.rand(@count)
        i = @cumulative.bsearch_index { |c| c > pick }
        lo = i.zero? ? 0.0 : @bounds[i - 1]
        hi = i < @bounds.size ? @bounds[i] : 2 * @bounds[-1]
        (lo + (rng.rand * (hi - lo))) * @scale
      end

      # The q-quantile (0..1) of the samples, or of the bucket midpoints.
      def quantile(q)
        return Advice.quantile(@samples.sort, q) if @samples

        target = q * @count
        i = @cumulative.bsearch_index { |c| c >= target } || (@bounds.size)
        lo = i.zero? ? 0.0 : @bounds[i - 1]
        hi = i < @bounds.size ? @bounds[i] : 2 * @bounds[-1]
        (lo + hi) / 2 * @scale
      end

      private

      def init_histogram(bounds, counts, sum)
        @count = counts.sum
        raise ArgumentError, "histogram is empty" if @count.zero?

        @bounds = bounds
        @cumulative = counts.each_with_object([]) { |c, acc| acc << ((acc.last || 0) + c) }
        mids = counts.each_with_index.sum do |c, i|
          lo = i.zero? ? 0.0 : bounds[i - 1]
          hi = i < bounds.size ? bounds[i] : 2 * bounds[-1]
          c * (lo + hi) / 2
        end
        natural = mids / @count
        @mean = sum ? sum / @count : natural
        @scale = natural.positive? && sum ? @mean / natural : 1.0
      end
    end

    # A Distribution whose draws are multiplied by a factor.
    class ScaledDistribution
      def initialize(dist, factor)
        @dist = dist
        @factor = factor
      end

      def mean = @dist.mean * @factor
      def count = @dist.count
      def draw(rng) = @dist.draw(rng) * @factor
      def quantile(q) = @dist.quantile(q) * @factor
    end
  end
end
