# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# The articles' two rules (shown beside the model), distributions and
# workloads.
class AdviceExplanationsTest < Minitest::Test
  A = Serval::Advice

  def test_amdahl_table_matches_the_articles_p_045
    # part 4 of the series: p = 0.45 -> 1.00, 1.29, 1.43, 1.51, 1.56, 1.60; stop at 4
    table = A::Amdahl.table(0.45, max: 6)
    assert_equal [1.0, 1.2903, 1.4286, 1.5094, 1.5625, 1.6], table.map { |r| r[:speedup] }
    assert_nil table[0][:gain]
    assert_in_delta 0.29, table[1][:gain], 0.005
    assert_in_delta 0.06, table[3][:gain], 0.005
    assert_in_delta 0.035, table[4][:gain], 0.001 # the article rounds it to 3 %
    assert_equal 4, A::Amdahl.pick(0.45)
  end

  # [io share, Amdahl's pick]
  [[0.0, 1], [0.3, 3], [0.45, 4], [0.65, 5], [0.8, 7], [0.95, 12]].each do |p, pick|
    define_method("test_amdahl_pick_#{(p * 100).round}") { assert_equal pick, A::Amdahl.pick(p) }
  end

  def test_amdahl_rejects_shares_outside_0_1
    assert_raises(ArgumentError) { A::Amdahl.table(1.2) }
    assert_raises(ArgumentError) { A::Amdahl.pick(-0.1) }
  end

  # [run, io, max req/s, threads]: Puma's 70 % and 35 % apps of 20 ms
  [[0.014, 0.006, 71.43, 2], [0.007, 0.013, 142.86, 3], [0.010, 0.010, 100.0, 2], [0.02, 0.0, 50.0, 1]]
    .each do |run, io, rps, threads|
    define_method("test_gvl_ceiling_#{(run * 1000).round}ms_of_#{((run + io) * 1000).round}") do
      g = A::GvlCeiling.call(run, io)
      assert_in_delta rps, g[:max_rps], 0.01
      assert_equal threads, g[:threads]
    end
  end

  def test_gvl_ceiling_without_run
    assert_equal({ cpu_share: 0.0, max_rps: nil, threads: nil }, A::GvlCeiling.call(0.0, 0.02))
    assert_raises(ArgumentError) { A::GvlCeiling.call(-0.001, 0.02) }
  end

  def test_distribution_from_samples
    d = A::Distribution.from([0.001, 0.002, 0.003, 0.010])
    assert_in_delta 0.004, d.mean, 1e-12
    assert_in_delta 0.0025, d.quantile(0.5), 1e-12
    rng = Random.new(1)
    assert_equal [0.001, 0.002, 0.003, 0.010], Array.new(200) { d.draw(rng) }.uniq.sort
  end

  def test_distribution_from_histogram_draws_inside_buckets_and_keeps_the_sum
    d = A::Distribution.from(bounds: [0.001, 0.01, 0.1], counts: [0, 90, 10, 0], sum: 0.9)
    assert_equal 100, d.count
    assert_in_delta 0.009, d.mean, 1e-12
    rng = Random.new(2)
    draws = Array.new(20_000) { d.draw(rng) }
    assert_in_delta 0.009, draws.sum / draws.size, 0.0005
    scale = 0.009 / ((90 * 0.0055) + (10 * 0.055)) * 100
    assert draws.all? { |x| x >= 0.001 * scale && x <= 0.1 * scale }
    assert_in_delta 0.1, draws.count { |x| x > 0.01 * scale } / 20_000.0, 0.01 # the top bucket holds 10 %
  end

  def test_distribution_rejects_bad_input
    assert_raises(ArgumentError) { A::Distribution.from([]) }
    assert_raises(ArgumentError) { A::Distribution.from([-1.0]) }
    assert_raises(ArgumentError) { A::Distribution.from([Float::NAN]) }
    assert_raises(ArgumentError) { A::Distribution.from(bounds: [0.1, 0.01], counts: [1, 1, 1]) }
    assert_raises(ArgumentError) { A::Distribution.from(bounds: [0.1], counts: [1]) }
    assert_raises(ArgumentError) { A::Distribution.from(bounds: [0.1], counts: [0, 0]) }
    assert_raises(ArgumentError) { A::Distribution.from("0.1") }
  end

  def test_workload_segments_and_share
    w = A::Workload.new(pairs: [[0.006, 0.014]], io_waits: 2)
    profile = w.profiles(1, Random.new(1)).first
    assert_equal 5, profile.size
    assert_in_delta 0.006, profile.values_at(0, 2, 4).sum, 1e-12
    assert_in_delta 0.014, profile.values_at(1, 3).sum, 1e-12
    assert_in_delta 0.3, w.cpu_share, 1e-12
    random = A::Workload.new(pairs: [[0.006, 0.014]], io_waits: 3, split: :random).profiles(5, Random.new(1))
    random.each { |p| assert_in_delta 0.02, p.sum, 1e-12 }
    refute_equal random[0], random[1]
    assert_equal [[0.01]], A::Workload.new(pairs: [[0.01, 0.0]]).profiles(1, Random.new(1))
    assert_raises(ArgumentError) { A::Workload.new(run: [0.01]) }
    assert_raises(ArgumentError) { A::Workload.new(pairs: [[0.01, 0.01]], io_waits: -1) }
  end
end
