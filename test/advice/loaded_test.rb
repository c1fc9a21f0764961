# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"
require "serval/timing"
require "serval/advice/report"

# The measured point from the loaded period: a minute with 20 s of load and
# 40 s idle reports the loaded rate, not the minute's average.
class AdviceLoadedTest < Minitest::Test
  TW = Serval::Timing::Window

  # [start, requests] newest first, as Timing.window_buckets gives them (the other fields unused here)
  def buckets(now, counts) = counts.each_with_index.map { |n, i| [((now / 10).floor - i) * 10.0, n] }

  def test_loaded_period_of_a_busy_then_idle_minute
    now = 1005.0 # the newest bucket (1000..1010) is half over
    b = buckets(now, [0, 0, 1, 700, 710, 3]) # idle now; loaded 20 s two steps back
    loaded = TW.loaded(b, 55.0, now)
    assert_equal({ requests: 1410, seconds: 20.0 }, loaded)
    # the newest bucket counts for the 5 s that have passed
    busy_now = TW.loaded(buckets(now, [350, 700, 0, 0, 0, 0]), 55.0, now)
    assert_equal({ requests: 1050, seconds: 15.0 }, busy_now)
    assert_nil TW.loaded(buckets(now, [0, 0]), 15.0, now)
    assert_nil TW.loaded([], 0.0, now)
  end

  def test_the_advice_reports_the_loaded_rate
    rng = Random.new(2)
    samples = Array.new(600) { { run: rng.rand * 0.01, idle: rng.rand * 0.02, stall: 0.0, wall: 0.02 } }
    win = { requests: 1410, seconds: 60.0, max_threads: 3, gvl_split: true, samples: samples,
            loaded: { requests: 1410, seconds: 20.0 } }
    a = Serval::Advice.recommend(win, machine: { cpus: 1.0 }, sim_requests: 3000, load_requests: 3000, precision: false,
                                      load_points: [], range: false)
    assert_in_delta 23.5, a[:measured][:rate], 0.01
    assert_in_delta 70.5, a[:measured][:loaded_rate], 0.01
    html = Serval::Advice::Report.new(a, window: win).html
    assert_includes html, "measured: 70.5 req/s served at 3 (loaded period)"
  end

  def test_bad_loaded_is_refused
    base = { requests: 5, samples: [{ run: 0.01, idle: 0.01 }] }
    [{ requests: -1, seconds: 1 }, { requests: 1, seconds: -1 }, { requests: "x", seconds: 1 }, [1, 2]].each do |bad|
      assert_raises(ArgumentError, bad.inspect) { Serval::Advice::Window.new(base.merge(loaded: bad)) }
    end
    assert_in_delta 0.5, Serval::Advice::Window.new(base.merge(seconds: 10.0)).loaded_rate_per_process
  end
end
