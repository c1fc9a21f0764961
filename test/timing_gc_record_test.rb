# frozen_string_literal: true

require_relative "test_helper"
require "serval/timing"
require "serval/advice"

# Major GCs over the window (lib/serval/timing/gc_record.rb) from injected
# GC.stat snapshots, the window that carries them, a cluster's merge, and
# the advice's warning when a small heap forces major after major.
class TimingGcRecordTest < Minitest::Test
  GcRecord = Serval::Timing::GcRecord

  # GC.stat as GcRecord.stat gives it: heap 0 (40-byte slots) forced `forced` majors.
  def stat(count, major, time_ms, forced, slots = 40_933)
    { count: count, major: major, time: time_ms, heaps: [[0, forced, 40, slots], [1, 0, 80, 10_639]] }
  end

  def recorder(stats)
    GcRecord.new(source: -> { stats.shift })
  end

  def test_figures_come_from_the_oldest_snapshot_inside_the_span
    r = recorder([stat(100, 10, 1_000, 5), stat(500, 30, 2_000, 20), stat(900, 90, 4_000, 75), stat(950, 91, 4_100, 75)])
    assert_nil r.read(60.0, now: 100.0), "one snapshot: nothing to compare"
    assert_nil r.read(60.0, now: 105.0), "snapshots closer than MIN_SECONDS give nothing"
    g = r.read(60.0, now: 130.0)
    assert_equal({ seconds: 30.0, collections: 800, majors: 80, gc_time: 3.0, nofree: 70,
                   heap: { index: 0, slot_size: 40, slots: 40_933 } }, g)
    later = r.read(60.0, now: 161.0)
    assert_equal 56.0, later[:seconds], "the 100 s snapshot is past the 60 s span: the 105 s one is the base"
    assert_equal 61, later[:majors]
  end

  def test_without_forced_counts_nofree_is_unknown
    old = ->(c, m) { { count: c, major: m, time: nil, heaps: [] } } # Ruby 3.1: no GC.stat_heap
    r = recorder([old.call(10, 1), old.call(20, 2)])
    r.read(60.0, now: 0.0)
    g = r.read(60.0, now: 30.0)
    assert_nil g[:nofree]
    assert_nil g[:heap]
    assert_nil g[:gc_time]
    assert_equal 1, g[:majors]
  end

  def test_the_window_carries_the_figures_from_its_second_read
    Serval::Timing.window_reset(1_000.0)
    r = recorder([stat(0, 0, 0, 0), stat(4_000, 400, 9_000, 390)])
    assert_nil Serval::Timing::Window.read(now: 1_000.0, gvl_split: true, gc: r)[:gc]
    w = Serval::Timing::Window.read(now: 1_040.0, gvl_split: true, gc: r)
    assert_equal 400, w[:gc][:majors]
    assert_equal 40.0, w[:gc][:seconds]
    refute Serval::Timing::Window.read(now: 1_041.0, gvl_split: true, gc: nil).key?(:gc), "gc: nil reads none"
  ensure
    Serval::Timing.window_reset
  end

  def test_a_merged_window_keeps_the_worst_process
    calm = { requests: 10, samples: [], gc: { seconds: 60.0, majors: 6, nofree: 0 } }
    churn = { requests: 10, samples: [], gc: { seconds: 30.0, majors: 300, nofree: 290 } }
    assert_equal 300, Serval::Timing::Window.merge([calm, churn, { requests: 1, samples: [] }])[:gc][:majors]
    refute Serval::Timing::Window.merge([{ requests: 1, samples: [] }]).key?(:gc)
  end

  def window(gc)
    rng = Random.new(3)
    samples = Array.new(400) { { run: 0.002 + (rng.rand * 0.001), idle: 0.02, stall: 0.0, wall: 0.023 } }
    { requests: 3_000, seconds: 60.0, max_threads: 8, gvl_split: true, samples: samples, gc: gc }
  end

  def gc_warning(gc)
    Serval::Advice.recommend(window(gc))[:warnings].grep(/major GCs/).first
  end

  def test_the_advice_warns_of_majors_forced_one_after_another
    text = gc_warning({ seconds: 50.0, majors: 500, nofree: 480, heap: { index: 0, slot_size: 40, slots: 40_933 } })
    assert_match(/major GCs: 10\.0 a second over 50 s, 96 % of them because the 40-byte heap \(40933 slots\)/, text)
    assert_match(/RUBY_GC_HEAP_0_INIT_SLOTS=170000/, text)
  end

  def test_no_warning_for_few_majors_or_majors_of_another_cause
    assert_nil gc_warning({ seconds: 50.0, majors: 90, nofree: 90, heap: { index: 0, slot_size: 40, slots: 40_933 } }),
               "under two a second"
    assert_nil gc_warning({ seconds: 50.0, majors: 500, nofree: 100, heap: { index: 0, slot_size: 40, slots: 40_933 } }),
               "most majors had another cause (old objects, malloc)"
    assert_nil gc_warning({ seconds: 50.0, majors: 500, nofree: nil }), "Ruby before 3.3 does not say"
    assert_nil gc_warning(nil)
  end

  def test_a_bad_gc_figure_is_refused
    assert_raises(ArgumentError) { Serval::Advice::Window.new(window({ seconds: 10.0, majors: -1 })) }
    assert_raises(ArgumentError) { Serval::Advice::Window.new(window("lots")) }
    assert_nil Serval::Advice::Window.new(window({ seconds: 0, majors: 5 })).gc
  end
end
