# frozen_string_literal: true

# Synthetic measurement windows in lib/serval/advice/window.rb's shape, as
# Launcher#window returns them: exponential run and idle with the given
# means (seconds), a seeded RNG.
module AdviceWindows
  module_function

  def exp(rng, mean) = -Math.log(1.0 - rng.rand) * mean

  def window(n, run: 0.007, idle: 0.013, threads: 3, seed: 11, **extra)
    rng = Random.new(seed)
    samples = Array.new(n) do
      r = exp(rng, run)
      i = exp(rng, idle)
      s = rng.rand * run / 2
      { run: r.round(6), idle: i.round(6), stall: s.round(6), pool_wait: 0.0, queue: 0.0001, wall: (r + i + s).round(6) }
    end
    { requests: n, seconds: 60.0, max_threads: threads, gvl_split: true, ruby: RUBY_VERSION, samples: samples }
      .merge(extra)
  end
end
