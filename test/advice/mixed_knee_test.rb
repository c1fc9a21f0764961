# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "zlib"
require "serval/advice"

# Mixed routes (issue 32 item 2): the model on a window recorded from
# bench/apps/advice_mixed.ru against the closed-loop sweep measured in the
# same run, and the two numbers the advice gives on a flat top - where 99 %
# of the best req/s is reached (knee_99) and the count with the lowest
# predicted p99 at part load (p99_threads) - beside its 95 % knee.
class AdviceMixedKneeTest < Minitest::Test
  A = Serval::Advice
  FIXTURE = File.expand_path("../fixtures/advice/mixed-window-7t.json.gz", __dir__)

  # The sweep measured with the fixture's window (branch mixedknee, Ruby
  # 3.3.8, 2026-11-28 16:47-16:50 UTC, load 1.0-2.5):
  # BENCH_ADVICE_SHARES= BENCH_ADVICE_CASES=mixed BENCH_ADVICE_AUTO=0 BENCH_ADVICE_ROUNDS=2
  # BENCH_ADVICE_MAX_THREADS=14 BENCH_ADVICE_WINDOWS=DIR flock /tmp/serval-bench.lock
  # bench/run --quick --no-docs --out=bench/results/advice-quick-mixed-probe1.json advice
  # (threads => median req/s of 2 rounds; the window: 7 threads, 1,816 requests)
  MEASURED = { 1 => 57.5, 2 => 102.9, 3 => 146.1, 4 => 167.4, 5 => 178.3, 6 => 181.3, 7 => 185.2, 8 => 187.5,
               9 => 187.3, 10 => 187.3, 11 => 178.7, 12 => 176.8, 13 => 187.0, 14 => 187.9 }.freeze
  MEASURED_KNEE = 6 # fewest threads with 95 % of the best (187.9): 5 served 178.3, 0.2 short

  def window = JSON.parse(Zlib::GzipReader.open(FIXTURE, &:read), symbolize_names: true)

  def advise(win, **opts)
    A.recommend(win, machine: { cpus: 1.0 }, precision: false, range: false, **opts)
  end

  def test_recorded_mixed_window_against_its_measured_sweep
    a = advise(window, load_points: [0.8])
    best = MEASURED.values.max
    assert_operator (a[:threads] - MEASURED_KNEE).abs, :<=, 1, "advised #{a[:threads]}, measured knee #{MEASURED_KNEE}"
    assert_in_delta 1.0, a[:max_rps_per_process] / best, 0.10
    # point by point: within 15 % at every count the model simulated (the
    # window's own sampling: its run / io ratio is known to +-17 %)
    a[:sweep].each do |row|
      m = MEASURED[row[:threads]] or next
      assert_in_delta 1.0, row[:rps] / m, 0.15, "#{row[:threads]} threads: model #{row[:rps]}, measured #{m}"
    end
    # the measured top is flat: 6-14 threads within 6 % of each other, and the
    # model's 99 % point sits inside it
    assert_operator a[:knee_99], :>, a[:knee]
    assert_includes (MEASURED_KNEE..MEASURED_KNEE + 3), a[:knee_99]
    p = a[:p99_threads]
    refute_nil p
    assert_in_delta 0.8 * a[:max_rps_per_process], p[:rate], 0.01
    assert_operator (p[:threads] - MEASURED_KNEE).abs, :<=, 1
  end

  def test_p99_threads_is_the_fewest_within_five_per_cent_of_the_lowest
    a = advise(window, load_points: [0.5, 0.8])
    p = a[:p99_threads]
    assert_equal 0.8, p[:load], "the top load point"
    tried = p[:tried].to_h
    lowest = tried.values.min
    assert_equal lowest, p[:lowest_p99]
    assert_equal tried.key(lowest), p[:lowest_at]
    fewest = tried.keys.sort.find { |t| tried[t] <= lowest * (1 + A::Recommender::P99_NEAR) }
    assert_equal fewest, p[:threads]
    assert_operator p[:threads], :<=, p[:lowest_at]
    # only counts that keep up are tried, from the first upward, through the 99 % point
    sweep = a[:sweep].to_h { |r| [r[:threads], r[:rps]] }
    tried.each_key { |t| assert_operator sweep.fetch(t), :>, p[:rate] }
    assert_equal (tried.keys.min..tried.keys.max).to_a, tried.keys
    assert_operator tried.keys.max, :>=, a[:knee_99]
    assert_operator tried.keys.max, :<=, [a[:knee_99], a[:threads]].max + A::Recommender::P99_PAST
    assert(a[:reasons].any? { |r| r.include?("predicted p99 is lowest at #{p[:lowest_at]} threads") })
    assert(a[:reasons].any? { |r| r.start_with?("the top is flat: #{a[:knee]} threads") })
  end

  def test_no_load_points_no_p99_threads
    a = advise(window, load_points: [])
    assert_nil a[:p99_threads]
    assert_operator a[:knee_99], :>=, a[:knee]
  end

  # CPU only: one thread is the top, and no flat-top sentence.
  def test_cpu_only_has_knee_99_at_the_knee
    rng = Random.new(3)
    samples = Array.new(2000) { { run: 0.01 * (0.9 + (0.2 * rng.rand)), idle: 0.0, stall: 0.0, wall: 0.01 } }
    a = advise({ requests: 2000, max_threads: 2, gvl_split: true, samples: samples }, load_points: [])
    assert_equal 1, a[:knee]
    assert_equal 1, a[:knee_99]
    refute(a[:reasons].any? { |r| r.start_with?("the top is flat") })
  end

  def test_sweep_fewest
    w = A::Window.new(window).workload
    sim = A::Simulation.new(w.profiles(3000, Random.new(1)))
    sweep = A::Sweep.new(sim, max: 16, fraction: 0.95)
    assert_equal sweep.knee, sweep.fewest(0.95)
    top = sweep.fewest(0.99)
    assert_operator top, :>=, sweep.knee
    assert_operator sweep.at(top).rps, :>=, 0.99 * sweep.best
    assert_operator sweep.fewest(0.5), :<=, sweep.knee
    assert_operator sweep.at(sweep.fewest(0.5)).rps, :>=, 0.5 * sweep.best
    assert_raises(ArgumentError) { sweep.fewest(0) }
    assert_raises(ArgumentError) { sweep.fewest(1.5) }
  end
end
