# frozen_string_literal: true

# bench/lib/bench/draws.rb, the draws of bench/apps/advice.ru: tagged draws
# repeat, stratified ones cover every stratum once per block and stay
# uniform, and a stratified block's mean exponential is close to 1 where an
# iid one's is not.
require_relative "test_helper"
require_relative "../bench/lib/bench/draws"

class BenchDrawsTest < Minitest::Test
  def exp_mean(tags, strata)
    tags.sum { |t| -Math.log(1.0 - Bench::Draws.new(t, strata, nil).uniform(0)) } / tags.size
  end

  def test_a_tag_is_the_same_work_every_time
    a = Bench::Draws.new(12_345, nil, nil)
    b = Bench::Draws.new(12_345, nil, nil)
    assert_equal [a.uniform(0), a.uniform(1)], [b.uniform(0), b.uniform(1)]
    refute_equal Bench::Draws.new(12_346, nil, nil).uniform(0), Bench::Draws.new(12_345, nil, nil).uniform(0)
  end

  def test_untagged_draws_come_from_the_given_random
    rng = Random.new(7)
    expected = Random.new(7).rand
    assert_equal expected, Bench::Draws.new(nil, 32, rng).uniform(0)
  end

  def test_each_block_holds_every_stratum_once_per_draw
    strata = 32
    [0, 1, 3].each do |draw|
      (5..7).each do |block|
        tags = (block * strata...(block + 1) * strata)
        cells = tags.map { |t| (Bench::Draws.new(t, strata, nil).uniform(draw) * strata).floor }
        assert_equal (0...strata).to_a, cells.sort, "block #{block} draw #{draw}"
      end
    end
  end

  def test_draws_of_one_request_are_shuffled_independently
    tags = (0...32)
    a = tags.map { |t| (Bench::Draws.new(t, 32, nil).uniform(0) * 32).floor }
    b = tags.map { |t| (Bench::Draws.new(t, 32, nil).uniform(1) * 32).floor }
    refute_equal a, b
  end

  def test_stratified_draws_are_uniform
    u = (0...4096).map { |t| Bench::Draws.new(t, 32, nil).uniform(0) }
    assert u.all? { |x| x >= 0 && x < 1 }
    # 16 bins of two strata each: exactly 2 x 128 blocks' draws in every bin
    bins = u.group_by { |x| (x * 16).floor }.transform_values(&:size)
    assert_equal (0..15).to_a, bins.keys.sort
    bins.each_value { |n| assert_equal 256, n }
  end

  def test_a_stratified_mean_strays_less_than_an_iid_one
    iid = (1..20).map { |k| (exp_mean((k * 10_240...(k * 10_240) + 256), nil) - 1).abs }
    strat = (1..20).map { |k| (exp_mean((k * 10_240...(k * 10_240) + 256), 32) - 1).abs }
    assert_operator strat.max, :<, 0.06
    assert_operator strat.sum, :<, iid.sum / 2
  end

  def test_a_draw_out_of_range_is_refused
    assert_raises(ArgumentError) { Bench::Draws.new(1, 32, nil).uniform(16) }
  end
end
