# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "json"
require "serval/timing"
require "serval/prometheus"
require "serval/advice"

# The rolling window (ext/serval/window.c, lib/serval/timing/window.rb) with
# an injected clock, the counters for rate(), and a real server's window. On
# every Ruby.
class TimingWindowTest < Minitest::Test
  include Serval::HttpWire

  T = Serval::Timing
  W = Serval::Timing::Window
  START = 10_000.0
  ROW = [0.001, 0.002, 0.003, 0.0, 0.0, 0.005, nil].freeze # queue run idle stall pool_wait wall cpu

  def setup
    T.window_reset(START)
  end

  def teardown
    T.window_reset
    super
  end

  def record(at, row = ROW, idle_periods = 1)
    T.window_record(at, row, idle_periods)
  end

  def test_requests_older_than_the_window_fall_out
    now = START + 70
    [70, 65, 55, 45, 35, 25, 15, 5, 0].each { |age| 3.times { record(now - age) } }
    w = W.read(now: now, gvl_split: true)
    # buckets of 10 s: the window at 70 s holds [20 s, 70 s]; ages 55..70 are gone
    assert_equal 18, w[:requests]
    assert_equal 18, w[:samples].size
    assert_equal 50.0, w[:seconds]
    assert_equal 18, w[:histograms][:run][:counts].sum
    assert_in_delta 18 * 0.002, w[:histograms][:run][:sum], 1e-9
    assert_equal({ queue: 0.001, run: 0.002, idle: 0.003, stall: 0.0, pool_wait: 0.0, wall: 0.005 }, w[:samples].first)
    later = W.read(now: now + 60, gvl_split: true)
    assert_equal 0, later[:requests], "a minute later nothing is left"
    assert_empty later[:samples]
  end

  def test_a_sample_keeps_its_shape
    T.window_record(START + 1, ROW, 1, [0.001, 0.003, 0.001])
    record(START + 1)
    w = W.read(now: START + 2, gvl_split: true)
    shapes = w[:samples].map { |s| s[:shape] }
    assert_equal [[0.001, 0.003, 0.001], nil].sort_by(&:to_s), shapes.sort_by(&:to_s)
    assert_raises(ArgumentError) { T.window_record(START + 1, ROW, 1, [0.001, 0.003]) }
    assert_raises(ArgumentError) { T.window_record(START + 1, ROW, 1, Array.new(T::WINDOW_SHAPE_SPANS + 2, 0.001)) }
    json = JSON.parse(JSON.generate(W.merge([w])))
    assert_equal 2, Serval::Advice::Window.new(json).workload.profiles(2, Random.new(1)).size
  end

  def test_a_young_process_covers_only_its_life
    record(START + 4)
    w = W.read(now: START + 5, gvl_split: true)
    assert_equal 1, w[:requests]
    assert_in_delta 5.0, w[:seconds], 1e-9
  end

  def test_the_reservoir_is_bounded_and_requests_are_all_counted
    now = START + 105 # each group of 2 s lies inside one bucket
    6.times { |b| 2000.times { |i| record(now - (b * 10) - (i * 0.001), [0.001, 0.001 * (i % 7), 0.0, 0.0, 0.0, 0.01, nil]) } }
    w = W.read(now: now + 0.5, gvl_split: true)
    assert_equal 12_000, w[:requests]
    assert_equal 12_000, w[:histograms][:run][:counts].sum
    assert_equal 12_000, w[:sampled_from]
    assert_operator w[:samples].size, :<=, W::CAP
    assert_operator w[:samples].size, :>=, W::CAP - 6, "every bucket's reservoir is full"
    # uniform: each value of run (i % 7) appears in the samples about as often as in the requests
    shares = w[:samples].group_by { |s| (s[:run] * 1000).round }.transform_values { |v| v.size.to_f / w[:samples].size }
    shares.each_value { |share| assert_in_delta 1.0 / 7, share, 0.04 }
  end

  # Past its first 512, a bucket draws how many requests to pass over before
  # the next one goes in (Algorithm L): 100,000 requests in one bucket, each
  # carrying its place in its run figure; the reservoir holds them uniformly
  # (each quarter of the requests about a quarter of it, the mean place about
  # half way), and shapes go with the requests that went in.
  def test_a_busy_bucket_keeps_a_uniform_sample
    now = START + 105
    n = 100_000
    n.times { |i| T.window_record(now - 5 + (i * 1e-5), [0.0, (i + 1) * 1e-6, 0.0, 0.0, nil, 0.001, nil], 1, [0.001, 0.0, 0.002]) }
    w = W.read(now: now, gvl_split: true)
    assert_equal n, w[:sampled_from]
    places = w[:samples].map { |s| (s[:run] * 1e6).round - 1 }
    assert_equal T::WINDOW_RESERVOIR, places.size
    assert_equal places.size, places.uniq.size, "no request twice"
    quarters = places.group_by { |p| p * 4 / n }.transform_values(&:size)
    (0..3).each { |q| assert_in_delta 0.25, quarters.fetch(q, 0).to_f / places.size, 0.08, "quarter #{q}: #{quarters}" }
    assert_in_delta n / 2.0, places.sum.to_f / places.size, n * 0.05
    assert(w[:samples].all? { |s| s[:shape] }, "each sample has its shape")
  end

  def test_a_quiet_bucket_does_not_outweigh_a_busy_one
    now = START + 30
    1000.times { |i| record(now - 15 - (i * 0.001), [0.0, 0.010, 0.0, 0.0, 0.0, 0.010, nil]) } # busy, run 10 ms
    10.times { |i| record(now - 1 - (i * 0.01), [0.0, 0.001, 0.0, 0.0, 0.0, 0.001, nil]) }     # quiet, run 1 ms
    w = W.read(now: now, gvl_split: true, rng: Random.new(3))
    runs = w[:samples].map { |s| s[:run] }
    quiet = runs.count { |r| r < 0.005 }
    assert_in_delta 10.0 / 1010, quiet.to_f / runs.size, 0.01
  end

  def test_io_waits_and_missing_figures
    record(START + 1, ROW, 2)
    record(START + 1, ROW, 0)
    record(START + 1, [0.001, nil, nil, nil, 0.0, 0.004, nil], nil) # no split, no CPU clock: counted, not sampled
    w = W.read(now: START + 2, gvl_split: true)
    assert_equal 3, w[:requests]
    assert_equal 1.0, w[:io_waits]
    assert_equal 2, w[:samples].size
    assert_equal 3, w[:histograms][:wall][:counts].sum
    assert_equal 2, w[:histograms][:run][:counts].sum
  end

  def test_ruby_31_shape_carries_cpu_and_wall
    record(START + 1, [0.001, 0.002, 0.003, nil, 0.0, 0.005, 0.002], nil)
    w = W.read(now: START + 2, gvl_split: false)
    assert_equal({ queue: 0.001, run: 0.002, idle: 0.003, cpu: 0.002, pool_wait: 0.0, wall: 0.005 }, w[:samples].first)
    refute w.key?(:io_waits)
  end

  def test_merge_adds_requests_and_histograms_and_draws_at_one_rate
    T.window_reset(START)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    a = W.read(now: START + 5, gvl_split: true, max_threads: 3)
    T.window_reset(START)
    300.times { |i| record(START + 1 + (i * 0.001), [0.001, 0.004, 0.003, 0.0, 0.0, 0.008, nil], 3) }
    b = W.read(now: START + 5, gvl_split: true, max_threads: 3, timeslice: 0.005)
    assert_equal 0.005, b[:timeslice]
    refute a.key?(:timeslice), "Ruby's own slice: no key"
    json = JSON.parse(JSON.generate(b)) # as it comes over the command channel
    m = W.merge([a, json])
    assert_equal 400, m[:requests]
    assert_equal 400, m[:histograms][:run][:counts].sum
    assert_in_delta (100 * 0.002) + (300 * 0.004), m[:histograms][:run][:sum], 1e-9
    assert_equal 400, m[:samples].size
    assert_equal 3, m[:max_threads]
    assert_in_delta 2.5, m[:io_waits], 1e-9
    assert_equal 400, m[:sampled_from]
    assert_equal 0.005, m[:timeslice]
  end

  # cpu_speed: CPU / GVL held per busy step of the window, oldest first.
  def test_cpu_speed_keeps_busy_steps_of_the_window
    T.window_reset(START - 10) # the window covers START - 10 .. START + 5
    100.times { |i| record(START + 1 + (i * 0.01)) }
    busy = Array.new(30) { |i| [START - 9 + (i * 0.25), 0.2, i == 3 ? 0.1 : 0.25] } # 0.5 at step 3, 1.25 -> 1
    quiet = [[START - 1.0, 0.01, 0.01]]                                      # GVL held 4 %: left out
    old = [[START - 11.0, 0.25, 0.25]]                                       # before the window
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, old + busy + quiet])
    assert_equal 30, w[:cpu_speed].size
    assert_equal 0.5, w[:cpu_speed][3]
    assert_equal 1.0, w[:cpu_speed].max
    few = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy.first(10)])
    refute few.key?(:cpu_speed), "fewer than #{W::SPEED_MIN_STEPS} busy steps say nothing"
    refute W.read(now: START + 5, gvl_split: false, steadiness: [0.25, busy]).key?(:cpu_speed), "no hook, no speed"
    m = W.merge([w, JSON.parse(JSON.generate(w)), few])
    assert_equal 60, m[:cpu_speed].size, "a cluster's workers' steps side by side"
  end

  # outside_cpu: the process's CPU beyond the GVL per second held, over
  # the window's busy steps (a quiet step's tickers are left out).
  def test_outside_cpu_from_busy_steps
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    busy = Array.new(8) { |i| [START - 9 + (i * 0.25), 0.2, 0.2, 0.21] }  # 5 % beyond the GVL
    quiet = [[START - 1.0, 0.01, 0.01, 0.05]]                             # a ticker's CPU, GVL 4 %: left out
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy + quiet])
    assert_in_delta 0.05, w[:outside_cpu], 1e-9
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy.first(3)]).key?(:outside_cpu),
           "fewer than #{W::OUTSIDE_MIN_STEPS} busy steps"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy.map { |st| st.first(3) }]).key?(:outside_cpu),
           "steps without the process's CPU (an older build)"
    other = w.merge(requests: w[:requests] * 3, outside_cpu: 0.09)
    assert_in_delta 0.08, W.merge([w, other])[:outside_cpu], 1e-9, "weighted by requests"
  end

  # outside_cpu sums the steps before its floor at 0: a slice counts in
  # the step it ends in, so held time runs ahead of the CPU in one step and
  # behind it in the next; keeping only the steps where the CPU came out
  # ahead would count that noise as CPU beyond the GVL.
  def test_outside_cpu_does_not_count_step_noise
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    steps = Array.new(8) { |i| [START - 9 + (i * 0.25), i.even? ? 0.22 : 0.18, 0.2, 0.2] } # CPU = held over two steps
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps])
    assert_in_delta 0.0, w[:outside_cpu], 1e-9
    behind = steps.map { |at, _h, c, pr| [at, 0.22, c, pr] } # held above the CPU in every step: floored
    assert_in_delta 0.0, W.read(now: START + 5, gvl_split: true, steadiness: [0.25, behind])[:outside_cpu], 1e-9
  end

  # cpu_per_request: the whole process's CPU over the window's steps (quiet
  # ones too) per request of the window; only when the steps span the window.
  def test_cpu_per_request_over_the_window
    T.window_reset(START - 10) # the window: START - 10 .. START + 5, 15 s
    300.times { |i| record(START + 1 + (i * 0.01)) }
    steps = Array.new(60) { |i| [START - 9.9 + (i * 0.25), 0.2, 0.2, i < 40 ? 0.21 : 0.01] } # 8.4 + 0.2 s
    old = [[START - 12.0, 0.25, 0.25, 5.0]] # before the window: left out
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, old + steps])
    assert_in_delta 15.0, w[:seconds], 1e-9
    assert_in_delta 8.6 / 300, w[:cpu_per_request], 1e-9
    short = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.last(40)])
    refute short.key?(:cpu_per_request), "10 s of steps for a 15 s window"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.map { |st| st.first(3) }]).key?(:cpu_per_request),
           "steps without the process's CPU"
    refute W.read(now: START + 5, gvl_split: false, steadiness: [0.25, steps]).key?(:cpu_per_request), "no hook"
    other = w.merge(requests: w[:requests] * 3, cpu_per_request: 0.01)
    assert_in_delta ((8.6 / 300) + (3 * 0.01)) / 4, W.merge([w, other])[:cpu_per_request], 1e-9, "weighted by requests"
    assert_equal w[:cpu_per_request], Serval::Advice::Window.new(w).cpu_per_request
  end

  # cpu_fit: the process's CPU per step regressed on the requests that ended
  # in the step (steps' fields 11 and 12: requests, their wall time).
  def test_cpu_fit_separates_the_fixed_cpu_from_the_cost_per_request
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    steps = Array.new(48) do |i|
      n = [0, 40, 100, 160][i % 4] # 0.02 CPU s a step (0.08 a second) + 1.1 ms per request
      [START - 9.9 + (i * 0.25), 0.1, 0.1, 0.02 + (0.0011 * n), 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, n, n * 0.01]
    end
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps])
    fit = w[:cpu_fit]
    assert_in_delta 0.08, fit[:fixed], 1e-9
    assert_in_delta 0.0011, fit[:per_request], 1e-12
    assert_in_delta 0.0, fit[:se], 1e-9, "an exact line"
    assert_equal 48, fit[:steps]
    assert_equal 3600, fit[:requests]
    assert_in_delta 3.0, fit[:inflight], 1e-9, "75 in a step x 0.01 s / 0.25 s"
    assert_in_delta (0.02 + (0.0011 * 160)) / 0.25, fit[:busy_p90], 1e-9, "the busiest quarter's CPU, above its GVL held"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.first(W::CPU_FIT_MIN_STEPS - 1)]).key?(:cpu_fit),
           "fewer than #{W::CPU_FIT_MIN_STEPS} steps"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.map { |st| st.first(11) }]).key?(:cpu_fit),
           "steps without their requests (an older build)"
    flat = steps.map { |st| st.dup.tap { |c| c[11] = 50 } }
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, flat]).key?(:cpu_fit), "no spread in the requests"
    refute W.read(now: START + 5, gvl_split: false, steadiness: [0.25, steps]).key?(:cpu_fit), "no hook"
    other = w.merge(requests: w[:requests] * 3, cpu_fit: fit.merge(fixed: 0.0, per_request: 0.0015))
    merged = W.merge([w, other])[:cpu_fit]
    assert_in_delta 0.02, merged[:fixed], 1e-9, "weighted by requests"
    assert_in_delta 0.0014, merged[:per_request], 1e-12
    assert_equal 96, merged[:steps]
    assert_equal fit[:per_request], Serval::Advice::Window.new(w).cpu_fit[:per_request]
  end

  # gvl_between: the GVL held outside requests per second held in them, over
  # the window's busy steps.
  def test_gvl_between_from_busy_steps
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    busy = Array.new(8) { |i| [START - 9 + (i * 0.25), 0.21, 0.21, 0.22, 0.01] } # 0.01 of 0.21 between requests
    quiet = [[START - 1.0, 0.02, 0.02, 0.02, 0.02]]                             # an app thread alone: left out
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy + quiet])
    assert_in_delta 0.05, w[:gvl_between], 1e-9
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy.first(3)]).key?(:gvl_between),
           "fewer than #{W::OUTSIDE_MIN_STEPS} busy steps"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, busy.map { |st| st.first(4) }]).key?(:gvl_between),
           "steps without it (an older build)"
    refute W.read(now: START + 5, gvl_split: false, steadiness: [0.25, busy]).key?(:gvl_between), "no hook"
    other = w.merge(requests: w[:requests] * 3, gvl_between: 0.09)
    assert_in_delta 0.08, W.merge([w, other])[:gvl_between], 1e-9, "weighted by requests"
  end

  # idle_cpu_wait: the share of the sampled in-request idle spans (gvl.c) the
  # threads spent ready, waiting for a CPU, over the window's steps, quiet
  # or busy.
  def test_cpu_wait_from_the_sampled_idle_spans
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    # 0.01 s of 0.1 s idle waited for a CPU, 5 spans per step
    steps = Array.new(8) { |i| [START - 9 + (i * 0.25), 0.2, 0.2, 0.2, 0.0, 0.01, 0.1, 5] }
    old = [[START - 20, 0.2, 0.2, 0.2, 0.0, 0.1, 0.1, 50]] # before the window: left out
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, old + steps])
    assert_in_delta 0.1, w[:idle_cpu_wait], 1e-9
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.first(3)]).key?(:idle_cpu_wait),
           "fewer than #{W::IDLE_CPU_WAIT_MIN_SPANS} spans"
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps.map { |st| st.first(6) }]).key?(:idle_cpu_wait),
           "steps without it (an older build)"
    refute W.read(now: START + 5, gvl_split: false, steadiness: [0.25, steps]).key?(:idle_cpu_wait), "no hook"
    refute w.key?(:idle_send_wait), "8-figure steps say nothing of sends"
    other = w.merge(requests: w[:requests] * 3, idle_cpu_wait: 0.3)
    assert_in_delta 0.25, W.merge([w, other])[:idle_cpu_wait], 1e-9, "weighted by requests"
    advice = Serval::Advice::Window.new(w)
    assert_in_delta 0.1, advice.idle_cpu_wait
    assert_raises(ArgumentError) { Serval::Advice::Window.new(w.merge(idle_cpu_wait: -0.1)) }
    assert_raises(ArgumentError) { Serval::Advice::Window.new(w.merge(idle_cpu_wait: 1.0)) }
  end

  # The wait for a CPU inside sends whose answer was still out is the
  # remote's time, not a wait for the GVL: it stays in the I/O (out of
  # idle_cpu_wait); the GVL waits after such sends that the link missed
  # come back as idle_send_wait, per second of sampled idle.
  def test_the_wait_in_sends_stays_in_the_io
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    # per step: 0.03 s of 0.1 s idle waited for a CPU, 0.01 s of it in sends; 0.02 s of GVL waits after them
    steps = Array.new(8) { |i| [START - 9 + (i * 0.25), 0.2, 0.2, 0.2, 0.0, 0.03, 0.1, 5, 0.01, 0.02] }
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps], sends: nil)
    assert_in_delta 0.2, w[:idle_cpu_wait], 1e-9
    assert_in_delta 0.2, w[:idle_send_wait], 1e-9
    other = w.merge(requests: w[:requests] * 3, idle_send_wait: 0.4)
    assert_in_delta 0.35, W.merge([w, other])[:idle_send_wait], 1e-9, "weighted by requests"
    assert_in_delta 0.2, Serval::Advice::Window.new(w).idle_send_wait
    assert_raises(ArgumentError) { Serval::Advice::Window.new(w.merge(idle_send_wait: -0.1)) }
    refute w.key?(:idle_send_hidden), "no sends given"
    # sampled sends (Native::GVL.sends' shape): the remote's time the answered ones hid, per second of sampled idle
    answered = Array.new(40, 0)
    in_wait = Array.new(40, 0)
    times = Array.new(40, 0.0)
    answered[3] = 40 # 10 us: no contention, no answer in yet
    times[3] = 40 * 10e-6
    answered[24] = 30 # 5 ms: a third answered
    in_wait[24] = 15
    times[24] = 45 * 0.005
    sends = [answered, in_wait, times]
    hidden = Serval::Advice::HiddenRemote.seconds(answered: answered, in_wait: in_wait, times: times)
    assert_operator hidden, :>, 0
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps], sends: sends).key?(:idle_send_hidden),
           "10-figure steps do not say what the link filed"
    # 11th figure: the GVL waits the link filed after sampled sends whose answer had come, 0.001 s per step
    steps = steps.map { |st| st + [0.001] }
    # (the filed waits are idle the histograms count: the shares are per second of spans and filed waits)
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps], sends: sends)
    assert_in_delta ((hidden - 0.008) / 0.808).round(4), w[:idle_send_hidden], 1e-9
    assert_in_delta (0.16 / 0.808).round(4), w[:idle_send_wait], 1e-9
    assert_in_delta (0.16 / 0.808).round(4), w[:idle_cpu_wait], 1e-9
    few = [answered.map { |n| n / 10 }, in_wait.map { |n| n / 10 }, times]
    refute W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps], sends: few).key?(:idle_send_hidden),
           "fewer than #{Serval::Advice::HiddenRemote::MIN_SENDS} sends"
    other = w.merge(requests: w[:requests] * 3, idle_send_hidden: 0.0)
    assert_in_delta w[:idle_send_hidden] / 4, W.merge([w, other])[:idle_send_hidden], 1e-4, "weighted by requests"
    assert Serval::Advice::Window.new(w.merge(idle_send_hidden: -0.1)), "the link may have filed more than was hidden"
    assert_raises(ArgumentError) { Serval::Advice::Window.new(w.merge(idle_send_hidden: -1.5)) }
  end

  # The GVL waits the link filed into idle after sampled sends (answered:
  # figure 11; still out: figure 14) are in the histograms' idle but in no
  # sampled span. A step's idle as the histograms count it: 0.1 s of spans
  # + 0.02 + 0.05 s filed = 0.17 s. Its remote time: the spans less their
  # wait for a CPU outside sends (0.03 - 0.01), plus the filed waits, plus
  # the GVL waits after preempted sends (0.04) = 0.19 s. The model's I/O,
  # idle x (1 - idle_cpu_wait + idle_send_wait), must be that.
  def test_the_shares_are_per_second_of_the_idle_the_histograms_count
    T.window_reset(START - 10)
    100.times { |i| record(START + 1 + (i * 0.01)) }
    steps = Array.new(8) do |i|
      [START - 9 + (i * 0.25), 0.2, 0.2, 0.2, 0.0, 0.03, 0.1, 5, 0.01, 0.04, 0.02, 10, 0.5, 0.05]
    end
    w = W.read(now: START + 5, gvl_split: true, steadiness: [0.25, steps], sends: nil)
    assert_in_delta (0.02 / 0.17).round(4), w[:idle_cpu_wait], 1e-9
    assert_in_delta (0.04 / 0.17).round(4), w[:idle_send_wait], 1e-9
    assert_in_delta 0.19, 0.17 * (1 - w[:idle_cpu_wait] + w[:idle_send_wait]), 1e-4
  end

  def test_merge_bounds_the_samples
    big = { requests: 5000, sampled_from: 5000, gvl_split: true, samples: Array.new(3000) { { run: 0.001, idle: 0.0 } } }
    m = W.merge([big, big.dup])
    assert_operator m[:samples].size, :<=, W::CAP
    assert_equal 10_000, m[:requests]
  end

  def counter(stats, name)
    entry = stats.fetch(name)
    assert_equal :counter, entry[:type]
    entry[:value]
  end

  # Counters carry no state of the reader: two readers get the same figures,
  # and the figures only grow.
  def test_counters_are_monotonic_and_readers_do_not_disturb_each_other
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    with_server(app, max_threads: 1) do |server, port|
      3.times { assert_equal 200, http(port, get("/")).status }
      recorder = server.instance_variable_get(:@handler).timing
      one = recorder.stats
      two = recorder.stats
      names = %w[request_queue_seconds_total request_run_seconds_total request_idle_seconds_total
                 request_stall_seconds_total request_wall_seconds_total]
      names.each { |n| assert_equal counter(one, n), counter(two, n), n }
      refute one.key?("request_pool_wait_seconds_total"), "no Active Record: no pool_wait"
      assert_equal 3, counter(one, "requests_timed_total")
      assert_operator counter(one, "request_wall_seconds_total"), :>, 0
      3.times { assert_equal 200, http(port, get("/")).status }
      three = recorder.stats
      names.each { |n| assert_operator counter(three, n), :>=, counter(two, n), n }
      assert_operator counter(three, "request_wall_seconds_total"), :>, counter(two, "request_wall_seconds_total")
      assert_operator counter(three, "gvl_held_seconds_total"), :>=, counter(one, "gvl_held_seconds_total")
      assert_equal 6, counter(three, "requests_timed_total")
      text = Serval::Prometheus.render(server.stats)
      assert_match(/^# TYPE serval_request_wall_seconds_total counter$/, text)
      assert_match(/^serval_gvl_held_seconds_total \d/, text)
    end
  end

  def test_a_server_reports_its_window
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    with_server(app, max_threads: 2, timing_sample_rate: 1.0) do |server, port|
      5.times { assert_equal 200, http(port, get("/")).status }
      w = server.window
      assert_equal 5, w[:requests]
      assert_equal 2, w[:max_threads]
      assert_equal 5, w[:samples].size
      assert_equal Serval::Native::GVL.enabled?, w[:gvl_split]
      # run is GVL-held time (3.2+) or the thread's CPU clock (3.1), wall the
      # monotonic clock: two clocks, so allow their granularity on these
      # ~0.2 ms requests (CI on 3.1 saw run 0.200 ms against wall 0.146 ms)
      w[:samples].each { |s| assert_operator s[:wall] + 0.001, :>=, s[:run] }
      refute server.stats.key?(:window), "the samples stay out of /stats"
      window = Serval::Advice::Window.new(JSON.parse(JSON.generate(w)))
      assert_equal 5, window.measured
    end
  end
end
