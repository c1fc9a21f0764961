# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# What a merged (cluster) window and a fractional io_waits mean to the model.
class AdviceWindowTest < Minitest::Test
  def test_a_cluster_window_rate_is_per_process
    window = Serval::Advice::Window.new(requests: 1200, seconds: 60, processes: 2, samples: [{ run: 0.01, idle: 0.01 }])
    assert_in_delta 10.0, window.rate_per_process
    assert_in_delta 20.0, Serval::Advice::Window.new(requests: 1200, seconds: 60, samples: [{ run: 0.01, idle: 0.01 }])
                                                  .rate_per_process
    assert_nil Serval::Advice::Window.new(requests: 5, samples: [{ run: 0.01, idle: 0.01 }]).rate_per_process
  end

  # io_waits is a mean (the server counts idle periods per request): 1.5
  # gives requests of one and of two waits, half each, not a truncated 1.
  def test_fractional_io_waits_is_kept_as_a_mean
    window = Serval::Advice::Window.new(requests: 2, io_waits: 1.5, samples: [{ run: 0.01, idle: 0.01 }])
    assert_in_delta 1.5, window.io_waits
    workload = Serval::Advice::Workload.new(pairs: [[0.01, 0.01]], io_waits: 1.5)
    rng = Random.new(7)
    counts = Array.new(4000) { (workload.send(:segments, 0.01, 0.01, rng).size - 1) / 2 }
    assert_equal [1, 2], counts.uniq.sort
    assert_in_delta 1.5, counts.sum / counts.size.to_f, 0.05
  end

  # A sample's measured shape is played as it ran: its own number of waits
  # and their proportions, rescaled to the request's run and to its idle
  # minus pool_wait (the pool's share the model adds back itself).
  def test_a_shaped_sample_is_played_as_it_ran
    shape = [0.002, 0.00002, 0.001, 0.006, 0.001]
    window = Serval::Advice::Window.new(requests: 1, io_waits: 1,
                                        samples: [{ run: 0.004, idle: 0.008, pool_wait: 0.002, shape: shape }])
    workload = window.workload
    assert_in_delta 1.0, workload.shaped_share
    profile = workload.profiles(1, Random.new(1)).first
    assert_equal 5, profile.size, "two waits as measured, not io_waits = 1"
    held = profile.each_slice(2).sum(&:first)
    idle = profile.each_slice(2).sum { |pair| pair[1].to_f }
    assert_in_delta 0.004, held, 1e-12
    assert_in_delta 0.006, idle, 1e-12, "idle less pool_wait"
    assert_in_delta 0.002, profile[0], 1e-12, "held spans keep their proportions"
    assert_in_delta 0.006 * 0.00002 / 0.00602, profile[1], 1e-12, "so do the idle ones"
  end

  # The link (ext/serval/gvl.c): a short idle span (a send), a short held
  # span, then a wait is one remote operation; the profile gives that wait
  # as -R, R from the send's start. A long held span between keeps two waits.
  def test_joined_waits_in_a_shape
    send = 0.00004
    eps = 0.000005
    joined = [0.001, send, eps, 0.009, 0.001]
    apart = [0.001, send, 0.0005, 0.009, 0.001]
    long_send = [0.001, 0.0005, eps, 0.009, 0.001]
    [[joined, true], [apart, false], [long_send, false]].each do |shape, linked|
      held = shape.each_slice(2).sum(&:first)
      idle = shape.each_slice(2).sum { |pair| pair[1].to_f }
      w = Serval::Advice::Workload.new(pairs: [[held, idle, shape]])
      profile = w.profiles(1, Random.new(1)).first
      if linked
        assert_in_delta(-(send + eps + 0.009), profile[3], 1e-9, profile.inspect)
      else
        assert_in_delta shape[3], profile[3], 1e-9, profile.inspect
      end
      assert_in_delta shape[1], profile[1], 1e-9
    end
  end

  # outside_cpu (the process's CPU beyond the GVL per second held) becomes
  # the Simulation's loop_cpu, less the handoffs the model already charges
  # (one per CPU segment): the profiles stay as measured, capacity at
  # saturation is 1 / (run + tail), and at part load (the GVL free between
  # arrivals) the requests' latency is the same.
  def test_cpu_outside_the_gvl_is_taken_from_the_holders_only_when_the_gvl_is_busy
    samples = Array.new(200) { { run: 0.002, idle: 0.018, shape: [0.001, 0.009, 0.0005, 0.009, 0.0005] } }
    base = { requests: 200, io_waits: 2, gvl_handoff: 0.00002, samples: samples }
    plain = Serval::Advice::Window.new(base).workload
    tailed = Serval::Advice::Window.new(base.merge(outside_cpu: 0.1)).workload
    assert_in_delta 0.0, plain.tail_cpu
    assert_in_delta (0.1 * 0.002) - (0.00002 * 3), tailed.tail_cpu, 1e-12
    assert_equal({ loop_cpu: tailed.tail_cpu, between: 0.0 }, tailed.sim_options)
    assert_equal plain.profiles(1, Random.new(1)), tailed.profiles(1, Random.new(1))
    sim = ->(w) { Serval::Advice::Simulation.new(w.profiles(2000, Random.new(2)), **w.sim_options) }
    assert_in_delta 1 / (0.002 + tailed.tail_cpu), sim.call(tailed).closed(16).rps, 5
    light = ->(w) { sim.call(w).open(2, rate: 10, rng: Random.new(4)).latency_p50 }
    assert_in_delta light.call(plain), light.call(tailed), 1e-9
    assert_in_delta 0.0, Serval::Advice::Window.new(base.merge(outside_cpu: 0.01)).workload.tail_cpu,
                    1e-12, "less than the handoffs: nothing added"
    assert_raises(ArgumentError) { Serval::Advice::Window.new(base.merge(outside_cpu: -1)) }
  end

  # gvl_between (GVL held outside requests per second held in them) is
  # played after each request's response (Simulation's `between`): the
  # capacity at saturation is 1 / (run + between); one thread's requests
  # answer as fast (it is not in their latency) but it serves fewer.
  def test_gvl_held_between_requests_is_charged_after_the_response
    samples = Array.new(200) { { run: 0.002, idle: 0.018, shape: [0.001, 0.009, 0.0005, 0.009, 0.0005] } }
    base = { requests: 200, io_waits: 2, gvl_handoff: 0.00002, samples: samples }
    window = Serval::Advice::Window.new(base.merge(gvl_between: 0.25))
    assert_in_delta 0.25, window.gvl_between
    between = window.workload
    assert_in_delta 0.25 * 0.002, between.between, 1e-12
    plain = Serval::Advice::Window.new(base).workload
    sim = ->(w) { Serval::Advice::Simulation.new(w.profiles(2000, Random.new(2)), **w.sim_options) }
    assert_in_delta 1 / 0.0025, sim.call(between).closed(16).rps, 5
    one = sim.call(between).closed(1)
    assert_in_delta sim.call(plain).closed(1).wall_p50, one.wall_p50, 1e-9
    assert_in_delta 1 / 0.0205, one.rps, 0.5
    assert_raises(ArgumentError) { Serval::Advice::Window.new(base.merge(gvl_between: -0.1)) }
    assert_raises(ArgumentError) { Serval::Advice::Window.new(base.merge(gvl_between: Float::INFINITY)) }
    # a hello-world server measures far more GVL between requests than in them (seen: > 10)
    assert_in_delta 0.002 * 14, Serval::Advice::Window.new(base.merge(gvl_between: 14)).workload.between, 1e-12
    many = base.merge(requests: 1200, samples: samples * 6, gvl_between: 0.05)
    advice = Serval::Advice.recommend(many, machine: { cpus: 1.0, cpu_source: "test" }, load_points: [], precision: false)
    assert_in_delta 0.05, advice[:workload][:gvl_between]
  end

  # idle_cpu_wait (the share of idle a thread spent ready, waiting for a CPU)
  # comes out of the model's I/O: the model plays that wait as stall. One
  # thread alone gets the GVL at once, so its requests answer that much
  # sooner; pool_wait comes out first, and histograms scale the same way;
  # Ruby 3.1's figures (no hook, no split) are left as they are.
  def test_the_wait_for_a_cpu_comes_out_of_the_io
    samples = Array.new(200) { { run: 0.002, idle: 0.020, pool_wait: 0.002, shape: [0.001, 0.009, 0.0005, 0.009, 0.0005] } }
    base = { requests: 200, io_waits: 2, samples: samples }
    plain = Serval::Advice::Window.new(base).workload
    ready = Serval::Advice::Window.new(base.merge(idle_cpu_wait: 0.25)).workload
    assert_in_delta 0.018, plain.mean_io, 1e-12
    assert_in_delta 0.018 * 0.75, ready.mean_io, 1e-12
    assert_in_delta plain.mean_run, ready.mean_run, 1e-12
    one = ->(w) { Serval::Advice::Simulation.new(w.profiles(500, Random.new(2)), **w.sim_options).closed(1) }
    assert_in_delta one.call(plain).wall_p50 - (0.018 * 0.25), one.call(ready).wall_p50, 1e-9
    hist = { bounds: [0.001, 0.01, 0.1], counts: [0, 0, 10, 0], sum: 0.2 }
    histo = { requests: 10, histograms: { run: { bounds: [0.001, 0.01, 0.1], counts: [0, 10, 0, 0], sum: 0.02 }, idle: hist } }
    assert_in_delta 0.75 * Serval::Advice::Window.new(histo).workload.mean_io,
                    Serval::Advice::Window.new(histo.merge(idle_cpu_wait: 0.25)).workload.mean_io, 1e-12
    old = Serval::Advice::Window.new(requests: 1, gvl_split: false, idle_cpu_wait: 0.25, samples: [{ cpu: 0.002, wall: 0.02 }])
    assert_in_delta 0.018, old.workload.mean_io, 1e-12
    # the remote's time the hook filed as stall (idle_send_wait) goes back in
    sent = Serval::Advice::Window.new(base.merge(idle_cpu_wait: 0.25, idle_send_wait: 0.1)).workload
    assert_in_delta 0.018 * 0.85, sent.mean_io, 1e-12
    assert_in_delta 0.85 * Serval::Advice::Window.new(histo).workload.mean_io,
                    Serval::Advice::Window.new(histo.merge(idle_cpu_wait: 0.25, idle_send_wait: 0.1)).workload.mean_io, 1e-12
    # and the remote's time hidden in GVL waits (idle_send_hidden)
    hid = Serval::Advice::Window.new(base.merge(idle_cpu_wait: 0.25, idle_send_wait: 0.1, idle_send_hidden: 0.2)).workload
    assert_in_delta 0.018 * 1.05, hid.mean_io, 1e-12
  end

  # The samples keep each request's figures together, the histograms' sums
  # count every request: the model takes the samples at the histograms'
  # means, figure by figure (run, idle, pool_wait; cpu and wall on 3.1), and
  # leaves them as they are where a histogram is missing or far off.
  def test_the_samples_are_taken_at_the_histograms_means
    rng = Random.new(3)
    samples = Array.new(300) do
      run = -0.002 * Math.log(1 - rng.rand)
      { run: run, idle: 0.02 + rng.rand * 0.004, pool_wait: 0.001, shape: [run / 2, 0.01, run / 2] }
    end
    mean = ->(k) { samples.sum { |s| s[k] } / samples.size }
    hist = ->(m, n) { { bounds: [0.001, 0.01, 0.1], counts: [0, n, 0, 0], sum: m * n } }
    base = { requests: 3000, io_waits: 1, samples: samples }
    raw = Serval::Advice::Window.new(base).workload
    assert_in_delta mean[:run], raw.mean_run, 1e-12
    full = Serval::Advice::Window.new(base.merge(histograms: { run: hist[0.0023, 3000], idle: hist[0.025, 3000],
                                                                pool_wait: hist[0.002, 3000] }))
    assert_in_delta 0.0023, full.workload.mean_run, 1e-12
    assert_in_delta 0.025 - 0.002, full.workload.mean_io, 1e-12
    # each request keeps its share of the run: scaled, not shifted
    k = 0.0023 / mean[:run]
    assert_in_delta samples.map { |s| s[:run] }.max * k, full.calibrated.map { |s| s[:run] }.max, 1e-12
    assert_equal samples, Serval::Advice::Window.new(base).calibrated
    # a histogram three times the samples' mean is of other requests: kept as it is
    off = Serval::Advice::Window.new(base.merge(histograms: { run: hist[mean[:run] * 3, 10] }))
    assert_in_delta mean[:run], off.workload.mean_run, 1e-12
    # Ruby 3.1: cpu and wall
    old = Serval::Advice::Window.new(requests: 20, gvl_split: false, samples: [{ cpu: 0.002, wall: 0.02 }, { cpu: 0.004, wall: 0.03 }],
                                     histograms: { cpu: hist[0.0033, 20], wall: hist[0.0275, 20] })
    assert_in_delta 0.0033, old.workload.mean_run, 1e-12
    assert_in_delta 0.0275 - 0.0033, old.workload.mean_io, 1e-12
    served = Serval::Advice::Window.new(requests: 20, gvl_split: false, samples: [{ cpu: 0.002, wall: 0.02 }, { cpu: 0.004, wall: 0.03 }],
                                        histograms: { run: hist[0.0033, 20], wall: hist[0.0275, 20] })
    assert_in_delta 0.0033, served.workload.mean_run, 1e-12
  end

  def test_a_shape_must_alternate_held_and_idle
    assert_raises(ArgumentError) { Serval::Advice::Workload.new(pairs: [[0.01, 0.01, [0.01, 0.01]]]) }
    assert_raises(ArgumentError) { Serval::Advice::Workload.new(pairs: [[0.01, 0.01, [0.01, -0.01, 0.01]]]) }
    # a shape the window cannot use (even length) is dropped, not fatal
    window = Serval::Advice::Window.new(requests: 1, samples: [{ run: 0.01, idle: 0.01, shape: [0.01, 0.01] }])
    assert_in_delta 0.0, window.workload.shaped_share
  end

  # Same totals, different shapes: a CPU block cut by a 20 us write gives
  # the GVL away and queues again behind the other threads, which the even
  # split (one wait in the middle) cannot show; replaying the shape lowers
  # the predicted throughput at 4 threads.
  def test_shapes_change_the_prediction
    rng = Random.new(3)
    pairs = Array.new(400) do
      run = -Math.log(1 - rng.rand) * 0.007
      io = -Math.log(1 - rng.rand) * 0.013
      [run, io, [run / 4, 0.00002, run / 4, io, run / 4, 0.00002, run / 4]]
    end
    plain = Serval::Advice::Workload.new(pairs: pairs.map { |r, i, _| [r, i] })
    shaped = Serval::Advice::Workload.new(pairs: pairs)
    rps = ->(w) { Serval::Advice::Simulation.new(w.profiles(4000, Random.new(1))).closed(4).rps }
    assert_operator rps.call(shaped), :<, rps.call(plain) * 0.99
  end

  # A server with fair_timeslice records its slice in the window; the model
  # then shares the GVL in that slice instead of Ruby's 100 ms, as the
  # server did (long CPU requests beside short ones: a different sweep).
  def test_the_window_timeslice_is_the_simulated_quantum
    rng = Random.new(5)
    samples = Array.new(1200) do |i|
      i.even? ? { run: 0.04 + (rng.rand * 0.02), idle: 0.001 } : { run: 0.001, idle: 0.01 + (rng.rand * 0.01) }
    end
    base = { requests: 1200, seconds: 60, max_threads: 4, samples: samples }
    sweep = ->(w, **o) { Serval::Advice.recommend(w, sim_requests: 4000, **o)[:sweep].map { |r| r[:rps] } }
    fair = sweep.call(base.merge(timeslice: 0.005))
    assert_equal sweep.call(base, quantum: 0.005), fair
    refute_equal sweep.call(base), fair
    assert_in_delta 0.005, Serval::Advice::Window.new(base.merge(timeslice: 0.005)).timeslice
    assert_raises(ArgumentError) { Serval::Advice::Window.new(base.merge(timeslice: 0)) }
  end
end
