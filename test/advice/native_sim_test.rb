# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# The simulation loop compiled (ext/serval/sim.c) against the same loop in
# Ruby (Simulation#play_ruby): the same figures to the last bit, on seeded
# random workloads that use every option of the model.
class AdviceNativeSimTest < Minitest::Test
  A = Serval::Advice
  S = Serval::Native::Sim

  # Random profiles: 1-5 waits, some joined (-R), some requests with no
  # wait at all.
  def profiles(rng, n)
    Array.new(n) do
      k = rng.rand(6)
      p = [rng.rand * 0.004]
      k.times do |j|
        io = rng.rand < 0.5 ? rng.rand * 150e-6 : rng.rand * 0.02
        io = -(io + 0.001) if j.positive? && rng.rand < 0.2
        p << io << (rng.rand < 0.1 ? rng.rand * 0.15 : rng.rand * 0.003)
      end
      p
    end
  end

  def options(rng, trial)
    opts = { quantum: [0.1, 0.004].sample(random: rng), handoff: [0.0, 30e-6].sample(random: rng),
             order: trial % 5 == 4 ? :random : :fifo, pool: [nil, nil, 1, 3].sample(random: rng),
             loop_cpu: [0.0, 1e-4].sample(random: rng), between: [0.0, 5e-5].sample(random: rng),
             lock: [nil, 1 / 16.0, 0.5, 1.0].sample(random: rng), seed: trial,
             speed: [nil, Array.new(30) { 0.5 + rng.rand }].sample(random: rng), scale: [1.0, 1.07].sample(random: rng) }
    opts[:lock_within] = [nil, 200e-6].sample(random: rng) if opts[:lock]
    opts
  end

  def test_the_native_loop_gives_the_ruby_loops_figures
    rng = Random.new(11)
    seen = Hash.new(0)
    40.times do |trial|
      prof = profiles(rng, 300 + rng.rand(400))
      opts = options(rng, trial)
      threads = 1 + rng.rand(10)
      rate = 100 + rng.rand(500)
      ruby = A::Simulation.new(prof, **opts, engine: :ruby)
      native = A::Simulation.new(prof, **opts, engine: :native)
      runs = lambda do |sim|
        [sim.closed(threads), sim.open(threads, rate: rate, rng: Random.new(trial)), sim.scaled(1.2).closed(threads)]
          .map(&:to_h)
      end
      want = runs.call(ruby)
      assert_equal want, runs.call(native), "trial #{trial}: #{opts.except(:speed)}, #{threads} threads, #{rate}/s"
      seen[:lock] += 1 if want[0][:lock_waited].to_f.positive?
      seen[:pool] += 1 if want[0][:pool_wait_mean].positive?
      seen[:stall] += 1 if want[0][:stall_mean].positive?
      seen[:queue] += 1 if want[1][:queue_mean].positive?
    end
    %i[lock pool stall queue].each { |k| assert_operator seen[k], :>=, 3, "the trials exercise #{k}: #{seen}" }
  end

  def test_order_sum_and_positive_read_a_slice_as_ruby_would
    rng = Random.new(5)
    values = Array.new(2001) { rng.rand < 0.3 ? 0.0 : rng.rand * (rng.rand < 0.01 ? 1e3 : 1e-3) }
    values[7] = values[8] = values[9] # ties
    str = values.pack("d*")
    [[0, 2000], [200, 1800], [5, 5], [10, 11]].each do |from, to|
      slice = values[from..to]
      sorted = slice.sort
      ranks = [0, sorted.size - 1, sorted.size / 2, (sorted.size * 0.99).floor, sorted.size / 2]
      assert_equal ranks.map { |r| sorted[r] }, S.order(str, from, to, ranks)
      assert_equal slice.sum, S.sum(str, from, to)
      assert_equal slice.count(&:positive?), S.positive(str, from, to)
    end
  end

  def test_a_bad_slice_or_rank_raises_instead_of_reading_past_the_end
    str = [1.0, 2.0, 3.0].pack("d*")
    assert_raises(IndexError) { S.sum(str, 0, 3) }
    assert_raises(IndexError) { S.sum(str, 2, 1) }
    assert_raises(IndexError) { S.positive(str, -1, 1) }
    assert_raises(IndexError) { S.order(str, 0, 2, [3]) }
    assert_raises(ArgumentError) { S.play([1.0].pack("d*"), [0, 2].pack("q*"), nil, 1, nil, [0.1, 0, 1, 0, 0, 0, 0.25, 0], nil, nil) }
    assert_raises(ArgumentError) { S.play([1.0].pack("d*"), [0, 1].pack("q*"), nil, 0, nil, [0.1, 0, 1, 0, 0, 0, 0.25, 0], nil, nil) }
    assert_raises(ArgumentError) { A::Simulation.new([[0.001]], engine: :jit) }
  end

  def test_the_native_loop_is_the_default_where_the_extension_is_built
    assert_equal :native, A::Simulation.default_engine
  end
end
