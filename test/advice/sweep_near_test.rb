# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# The advice's range sweeps (the same requests a few per cent slower or
# faster) start near the knee already found: the same knee as the sweep from
# one thread (which stops early too), fewer rows. And a request drawn again is one profile, reshaped
# once.
class AdviceSweepNearTest < Minitest::Test
  A = Serval::Advice

  def sim(run, io, n: 3000)
    w = A::Workload.new(run: A::Distribution.exponential(run, rng: Random.new(1)),
                        io: A::Distribution.exponential(io, rng: Random.new(2)))
    A::Simulation.new(w.profiles(n, Random.new(3)))
  end

  def test_near_finds_the_knee_of_the_whole_sweep_with_fewer_rows
    rows = { near: 0, whole: 0 }
    [[0.007, 0.013], [0.014, 0.006], [0.002, 0.030], [0.020, 0.001], [0.001, 0.012]].each do |run, io|
      base = sim(run, io)
      knee = A::Sweep.new(base, max: 16, fraction: 0.95).knee
      [0.8, 0.95, 1.05, 1.25].each do |f|
        s = base.scaled(f)
        whole = A::Sweep.new(s, max: 16, fraction: 0.95)
        near = A::Sweep.new(s, max: 16, fraction: 0.95, near: knee)
        assert_equal whole.knee, near.knee, [run, io, f].inspect
        near.rows.each { |r| assert_equal whole.at(r.threads).to_h, r.to_h } # the same rows, only fewer
        rows[:near] += near.rows.size
        rows[:whole] += whole.rows.size
      end
    end
    assert_operator rows[:near], :<, rows[:whole] * 0.8
  end

  # The knee below the hint: the sweep walks down while its lowest row still
  # reaches the fraction.
  def test_near_walks_down_to_a_lower_knee
    s = sim(0.020, 0.001) # CPU-bound: the knee is 1 or 2 threads
    whole = A::Sweep.new(s, max: 16, fraction: 0.95)
    near = A::Sweep.new(s, max: 16, fraction: 0.95, near: 9)
    assert_equal whole.knee, near.knee
    assert_operator near.knee, :<=, 2
    assert_equal 16, A::Sweep.new(s, max: 16, fraction: 0.95, near: 40).max # a hint past max is clamped
  end

  def test_a_request_drawn_twice_is_one_profile
    pairs = [[0.004, 0.010, [0.001, 0.004, 0.002, 0.006, 0.001]], [0.002, 0.0]]
    w = A::Workload.new(pairs: pairs)
    profiles = w.profiles(200, Random.new(5))
    shaped = profiles.select { |p| p.size == 5 }
    assert_operator shaped.size, :>, 50
    assert shaped.all? { |p| p.equal?(shaped.first) }
    assert_in_delta 0.004, shaped.first.each_slice(2).sum(&:first), 1e-12 # held spans sum to run
  end
end
