# frozen_string_literal: true

module Bench
  # A request's uniform draws in bench/apps/advice.ru: draw 0 is its CPU time,
  # draws 1..q its queries' delays. Untagged from the given Random (the
  # thread's); tagged (r=N) from Random.new(N), so the same N is the same
  # work. With `strata` B as well, stratified (a Latin hypercube in blocks
  # of B tags): of the B requests tagged B x k .. B x k + B - 1, draw d of
  # each falls in another of B equal strata of [0, 1), the strata shuffled
  # by Random.new(16 x k + d), the place inside the stratum from
  # Random.new(N). Every draw is still uniform, so every time still
  # exponential; what B consecutive requests ask for in sum is no longer
  # luck. bench/lib/bench/workloads/advice.rb says which blocks it uses where.
  class Draws
    MAX_DRAWS = 16

    def initialize(tag, strata, rng)
      @tag = tag
      @strata = tag && strata
      @rng = tag ? Random.new(tag) : rng
    end

    def uniform(draw)
      raise ArgumentError, "draw #{draw} is not in 0...#{MAX_DRAWS}" unless (0...MAX_DRAWS).cover?(draw)
      return @rng.rand unless @strata

      block, place = @tag.divmod(@strata)
      (Draws.strata(@strata, block, draw)[place] + @rng.rand) / @strata
    end

    # The shuffled strata of one block and draw, kept per thread for the
    # last KEEP blocks and draws: shuffling 1,024 strata for every request
    # cost 118 us of the request's CPU (5 % of a 10 % CPU request's 2.3 ms,
    # time the advice's untagged window never paid); kept, it is one shuffle
    # per block per thread.
    KEEP = 64

    def self.strata(count, block, draw)
      cache = (Thread.current[:bench_draws_strata] ||= {})
      key = [count, block, draw]
      cache[key] ||= begin
        cache.shift while cache.size >= KEEP
        (0...count).to_a.shuffle(random: Random.new((block * MAX_DRAWS) + draw)).freeze
      end
    end
  end
end
