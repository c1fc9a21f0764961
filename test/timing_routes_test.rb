# frozen_string_literal: true

require_relative "test_helper"
require "serval/timing"
require "serval/advice"

# Per-route samples in the process (Timing::Routes): kept by 10 s bucket,
# bounded per bucket and in distinct routes, read into the window as
# route_samples, and taken by the advice's per-route view.
class TimingRoutesTest < Minitest::Test
  R = Serval::Timing::Routes
  Fake = Struct.new(:run, :idle, :stall, :wall, :cpu, :wait, keyword_init: true)

  def setup = R.reset
  def teardown = R.reset

  def env(path) = { "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => path }
  def t(run, idle) = Fake.new(run: run, idle: idle, stall: 0.0, wall: run + idle)

  def test_routes_by_bucket_and_window
    R.note(env("/posts/1"), t(0.002, 0.003), 1001.0)
    R.note(env("/posts/2"), t(0.002, 0.003), 1002.0)
    R.note(env("/feed"), t(0.012, 0.001), 1012.0)
    rows = R.buckets(1015.0)
    assert_equal [[["GET /feed", 0.012, 0.001, 0.0, 0.012 + 0.001]], 1], rows.first
    assert_equal 2, rows.last[1]
    assert_equal ["GET /posts/:id"], rows.last[0].map(&:first).uniq
    assert_empty R.buckets(1100.0), "a minute later: gone"
    # Ruby 3.1's sampled timing: cpu and wait
    R.note(env("/x"), Fake.new(run: nil, idle: nil, stall: nil, cpu: 0.004, wait: 0.006, wall: 0.01), 1013.0)
    assert_includes R.buckets(1015.0).first[0], ["GET /x", 0.004, 0.006, 0.0, 0.01]
    R.note(env("/y"), Fake.new(wall: 0.01), 1013.0)
    refute(R.buckets(1015.0).first[0].any? { |r| r[0] == "GET /y" }, "no figures: not kept")
  end

  def test_bounded
    (R::PER_BUCKET * 3).times { |i| R.note(env("/r/#{i}"), t(0.001, 0.001), 2000.0 + (i * 1e-4)) }
    rows, seen = R.buckets(2005.0).first
    assert_equal R::PER_BUCKET * 3, seen
    assert_equal R::PER_BUCKET, rows.size
    R.reset
    (R::MAX_ROUTES + 50).times { |i| R.note(env("/page-#{i}-of-many"), t(0.001, 0.001), 3000.0) }
    keys = R.buckets(3001.0).first[0].map(&:first).uniq
    assert_equal R::MAX_ROUTES + 1, keys.size
    assert_includes keys, "other"
  end

  def test_window_read_carries_them_to_the_advice
    now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    40.times { |i| R.note(env("/posts/#{i}"), t(0.002, 0.003), now) }
    40.times { R.note(env("/feed"), t(0.012, 0.001), now) }
    w = Serval::Timing::Window.read(now: now, gvl_split: true, steadiness: nil, sends: nil, rng: Random.new(1))
    assert_equal 80, w[:route_samples].size
    merged = Serval::Timing::Window.merge([w, w], rng: Random.new(1))
    assert_equal 160, merged[:route_samples].size
    rows = Serval::Advice::Routes.call(Serval::Advice::Window.new(w.merge(samples: [{ run: 0.01, idle: 0.01 }]))
                                                                .route_samples)
    assert_equal ["GET /feed", "GET /posts/:id"], rows.map { |r| r[:route] }
    assert_in_delta 0.5, rows.first[:share_requests], 1e-9
  end
end
