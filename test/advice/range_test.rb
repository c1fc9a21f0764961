# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# Advice from few requests, with its sampling error: the threads range
# (Recommender#threads_range) holds the answer, is wider at 300 requests
# than at 10,000, and the run / io ratio's interval (Workload#ratio_within)
# agrees with a bootstrap of the same pairs.
class AdviceRangeTest < Minitest::Test
  A = Serval::Advice
  FAST = { sim_requests: 5000, load_requests: 5000, precision: false, load_points: [] }.freeze

  def self.exp(rng, mean) = -Math.log(1.0 - rng.rand) * mean

  def pairs(n, run, idle, seed: 7)
    rng = Random.new(seed)
    Array.new(n) { [self.class.exp(rng, run), self.class.exp(rng, idle)] }
  end

  def window(n, run, idle, seed: 7)
    samples = pairs(n, run, idle, seed: seed).map { |r, i| { run: r, idle: i, stall: 0.0, wall: r + i } }
    { requests: n, max_threads: 4, gvl_split: true, samples: samples }
  end

  def advise(win, **opts) = A.recommend(win, machine: { cpus: 1.0 }, **FAST, **opts)

  def test_advice_from_300_requests_carries_a_range
    r = advise(window(300, 0.014, 0.006))
    assert r[:enough_data]
    lo, hi = r[:threads_range]
    assert_operator lo, :<=, r[:threads]
    assert_operator hi, :>=, r[:threads]
    assert_operator hi, :>, lo, "300 requests leave the knee open"
    assert_equal 300, r[:range][:basis]
    assert_match(/\Aadvice: #{r[:threads]} threads \(#{lo}-#{hi}\) x 1 processes \(cpu share 0\.\d\d from 300 requests/,
                 r[:summary])
    assert(r[:reasons].any? { |s| s.start_with?("from 300 requests the run / io ratio is known to") })
    s_lo, s_hi = r[:range][:cpu_share]
    assert_operator s_lo, :<, r[:cpu_share]
    assert_operator s_hi, :>, r[:cpu_share]
  end

  def test_the_range_narrows_as_data_grows
    within = [300, 1000, 3000, 10_000].map { |n| advise(window(n, 0.014, 0.006))[:range][:within] }
    within.each_cons(2) { |a, b| assert_operator b, :<, a, within.inspect }
    # the 1 / sqrt(n) law: 33 times the data, about a sixth of the width
    assert_in_delta Math.sqrt(300.0 / 10_000), within.last / within.first, 0.06
    wide = advise(window(300, 0.014, 0.006))[:threads_range]
    narrow = advise(window(10_000, 0.014, 0.006))[:threads_range]
    assert_operator narrow[1] - narrow[0], :<=, wide[1] - wide[0]
    assert_operator narrow[1] - narrow[0], :<=, 1
  end

  def test_more_requests_behind_the_means_narrow_it
    # 300 samples calibrated to histograms of 30,000 requests: the means rest on those
    win = window(300, 0.014, 0.006)
    hist = lambda do |key|
      sum = win[:samples].sum { |s| s[key] }
      { bounds: [1.0], counts: [30_000, 0], sum: sum * 100 }
    end
    r = advise(win.merge(requests: 30_000, histograms: { run: hist.call(:run), idle: hist.call(:idle) }))
    assert_equal 30_000, r[:range][:basis]
    assert_operator r[:range][:within], :<, advise(win)[:range][:within] / 5
  end

  def test_delta_method_agrees_with_a_bootstrap
    ps = pairs(400, 0.007, 0.013, seed: 3)
    k = A::Workload.new(pairs: ps).ratio_within
    rng = Random.new(5)
    ratio = ->(sample) { sample.sum(&:first) / sample.sum(&:last) }
    r0 = ratio.call(ps)
    boot = Array.new(2000) { ratio.call(Array.new(ps.size) { ps[rng.rand(ps.size)] }) }.sort
    half = (boot[(0.975 * boot.size).floor] - boot[(0.025 * boot.size).floor]) / 2 / r0
    assert_in_delta half, k, 0.1 * half
  end

  def test_no_range_when_asked_not_to_or_without_pairs
    r = advise(window(1000, 0.007, 0.013), range: false)
    assert_nil r[:threads_range]
    refute_match(/threads \(/, r[:summary])
    cpu_only = advise({ requests: 1000, max_threads: 4, gvl_split: true,
                        samples: pairs(1000, 0.01, 0.0).map { |r, i| { run: r, idle: i, wall: r + i } } })
    assert_nil cpu_only[:threads_range], "no I/O: no ratio to bound"
    assert_equal 1, cpu_only[:threads]
  end

  def test_threads_text
    assert_equal "3 threads (2-4)", A::Recommender.threads_text({ threads: 3, threads_range: [2, 4] })
    assert_equal "3 threads", A::Recommender.threads_text({ threads: 3, threads_range: [3, 3] })
    assert_equal "3 threads", A::Recommender.threads_text({ threads: 3 })
  end
end
