# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# The model of one process: closed-loop throughput against threads, GVL
# stall, the time slice, the database pool, open-loop latency. Cases whose
# answer is known exactly (constant service times) and properties that hold
# for random ones.
class AdviceSimulationTest < Minitest::Test
  A = Serval::Advice

  def sim(run, io, n: 4000, **opts)
    w = A::Workload.new(run: run, io: io)
    A::Simulation.new(w.profiles(n, Random.new(3)), **opts)
  end

  def exp(mean, seed) = A::Distribution.exponential(mean, rng: Random.new(seed))

  # 20 ms requests, constant: [cpu share, [req/s at 1..4 threads], knee]
  # (the GVL ceiling 1 / (0.02 x share) reached at ceil(1 / share) threads)
  CONSTANT = [
    [0.7, [50.0, 71.43, 71.43, 71.43], 2],
    [0.35, [50.0, 100.0, 142.86, 142.86], 3],
    [0.2, [50.0, 100.0, 150.0, 200.0], 5],
    [1.0, [50.0, 50.0, 50.0, 50.0], 1]
  ].freeze

  CONSTANT.each do |share, rps, knee|
    define_method("test_constant_#{(share * 100).round}pct") do
      s = sim([0.02 * share], [0.02 * (1 - share)])
      rps.each_with_index do |want, i|
        assert_in_delta want, s.closed(i + 1).rps, want * 0.005, "#{i + 1} threads"
      end
      assert_equal knee, A::Sweep.new(s, max: 8, fraction: 0.95).knee
    end
  end

  def test_one_thread_never_stalls_and_serves_one_over_wall
    r = sim(exp(0.006, 1), exp(0.014, 2)).closed(1)
    assert_equal 0.0, r.stall_mean
    assert_equal 0.0, r.queue_mean
    assert_in_delta 50.0, r.rps, 50 * 0.05 # mean wall 20 ms, up to sampling error
  end

  def test_random_service_times_push_the_knee_above_ceil_one_over_share
    s = sim(exp(0.007, 1), exp(0.013, 2), n: 10_000)
    sweep = A::Sweep.new(s, max: 12, fraction: 0.95)
    assert_operator sweep.knee, :>, 3
    assert_operator sweep.best, :<=, 1 / 0.007 * 1.05 # never above the GVL's ceiling (+ sampling)
    # more threads never lower throughput by more than noise, and stall grows
    sweep.rows.each_cons(2) do |a, b|
      assert_operator b.rps, :>=, a.rps * 0.99
      assert_operator b.stall_mean, :>=, a.stall_mean
    end
  end

  def test_closed_loop_stall_at_saturation_follows_littles_law
    # constant 14 ms CPU + 6 ms sleep, T threads: each request waits for the
    # other T - 1 requests' CPU: wall = T x 14 ms, stall = wall - 20 ms
    s = sim([0.014], [0.006])
    (2..6).each { |t| assert_in_delta (t * 0.014) - 0.020, s.closed(t).stall_mean, 1e-6 }
  end

  # Constant 14 ms CPU + 6 ms sleep at saturation: every grant goes to a
  # waiting thread, so each request costs the GVL 14 ms + the handoff; one
  # thread never waits and never pays it.
  def test_a_handoff_costs_capacity_on_every_contended_grant
    profiles = Array.new(2000) { [0.007, 0.006, 0.007] }
    plain = A::Simulation.new(profiles)
    handed = A::Simulation.new(profiles, handoff: 0.001)
    assert_in_delta plain.closed(1).rps, handed.closed(1).rps, 1e-9
    assert_in_delta 1 / 0.014, plain.closed(4).rps, 0.5
    assert_in_delta 1 / 0.016, handed.closed(4).rps, 0.5, "two contended grants per request"
    assert_raises(ArgumentError) { A::Simulation.new(profiles, handoff: -0.001) }
  end

  def test_the_time_slice_bounds_one_segments_wait
    # two threads serve requests computing 1 ms around a 60 ms wait; one
    # request in the middle computes for 1 s
    short = [0.001, 0.06, 0.001]
    profiles = Array.new(10, short) + [[1.0]] + Array.new(40, short)
    sliced = A::Simulation.new(profiles).closed(2)
    unsliced = A::Simulation.new(profiles, quantum: 1e9).closed(2)
    # with Ruby's 100 ms slice each of a short request's two CPU segments
    # waits at most one slice
    assert_operator sliced.stall_max, :<=, (2 * 0.1) + 1e-9
    assert_operator sliced.stall_max, :>=, 0.1 - 0.002
    # without it, one waits for the whole second
    assert_operator unsliced.stall_max, :>, 0.9
    assert_operator sliced.stall_mean, :<, unsliced.stall_mean
  end

  def test_pool_smaller_than_threads_waits_for_connections
    s = ->(pool) { sim([0.002], [0.018], pool: pool) }
    assert_equal 0.0, s.call(8).closed(8).pool_wait_mean
    tight = s.call(2).closed(8)
    assert_operator tight.pool_wait_mean, :>, 0.01
    # two connections, each held 18 ms per request: at most 2 / 18 ms
    assert_operator tight.rps, :<=, (2 / 0.018) * 1.01
    assert_operator s.call(8).closed(8).rps, :>, 2 * tight.rps
  end

  def test_open_loop_light_load_is_service_time_heavy_load_queues
    s = sim(exp(0.005, 1), exp(0.015, 2), n: 10_000)
    light = s.open(4, rate: 20)
    heavy = s.open(4, rate: 170)
    assert_operator light.queue_mean, :<, 0.001
    assert_in_delta 20.0, light.rps, 3.0
    assert_operator heavy.latency_p99, :>, 2 * light.latency_p99
    assert_operator heavy.stall_mean, :>, light.stall_mean
    assert_operator light.latency_p50, :<=, light.latency_p99
  end

  def test_reproducible_and_orders_share_throughput
    a = sim(exp(0.007, 1), exp(0.013, 2))
    b = sim(exp(0.007, 1), exp(0.013, 2))
    assert_equal a.closed(4).to_h, b.closed(4).to_h
    assert_equal a.open(3, rate: 90, rng: Random.new(9)).to_h, b.open(3, rate: 90, rng: Random.new(9)).to_h
    fifo = sim([0.014], [0.006]).closed(4)
    random = sim([0.014], [0.006], order: :random).closed(4)
    assert_in_delta fifo.rps, random.rps, fifo.rps * 0.01
    assert_operator random.wall_p99, :>, fifo.wall_p99 # random grants spread the wait
  end

  def test_sweep_of_sixteen_thread_counts_stays_bounded
    s = sim(exp(0.007, 1), exp(0.013, 2), n: A::DEFAULTS[:sim_requests])
    rows = A::Sweep.new(s, max: 16, fraction: 0.95, early_stop: false).rows
    assert_equal (1..16).to_a, rows.map(&:threads)
    assert rows.all? { |r| r.requests > A::DEFAULTS[:sim_requests] / 2 }
  end

  # The sweep stops once the rows left cannot move the knee: the same knee
  # and best-so-far as the whole sweep, fewer rows, and a row past the stop
  # is simulated when asked for.
  def test_sweep_stops_early_with_the_same_knee
    [[0.007, 0.013], [0.014, 0.006], [0.002, 0.030], [0.020, 0.001]].each do |run, io|
      s = sim(exp(run, 1), exp(io, 2), n: 4000)
      full = A::Sweep.new(s, max: 16, fraction: 0.95, early_stop: false)
      fast = A::Sweep.new(s, max: 16, fraction: 0.95)
      assert_equal full.knee, fast.knee, [run, io].inspect
      assert_operator fast.rows.size, :>=, [A::Sweep::MIN_ROWS, fast.knee + A::Sweep::TAIL, 16].sort[1]
      assert_equal full.rows.first(fast.rows.size).map(&:to_h), fast.rows.map(&:to_h)
      assert_equal full.at(16).to_h, fast.at(16).to_h
      assert_equal 16, fast.rows.size
    end
    io_bound = A::Sweep.new(sim(exp(0.001, 1), exp(0.050, 2), n: 4000), max: 16, fraction: 0.95)
    refute io_bound.stopped_early? # still growing at 16 threads
    cpu_bound = A::Sweep.new(sim(exp(0.020, 1), exp(0.001, 2), n: 4000), max: 16, fraction: 0.95)
    assert cpu_bound.stopped_early?
  end

  def test_bad_arguments
    assert_raises(ArgumentError) { A::Simulation.new([]) }
    assert_raises(ArgumentError) { sim([0.01], [0.01], quantum: 0) }
    assert_raises(ArgumentError) { sim([0.01], [0.01], pool: 0) }
    assert_raises(ArgumentError) { sim([0.01], [0.01], order: :lifo) }
    assert_raises(ArgumentError) { sim([0.01], [0.01]).closed(0) }
    assert_raises(ArgumentError) { sim([0.01], [0.01]).open(2, rate: 0) }
  end

  # The CPU's measured speed (Window#cpu_speed) replayed in open loop: a
  # constant speed is scaled to 1 (the measured run times already hold it);
  # dips clustered in time lengthen the tail near capacity, hardly at light
  # load, and leave closed-loop throughput alone.
  def test_a_constant_speed_changes_nothing
    plain = sim(exp(0.014, 1), exp(0.006, 2))
    slow = sim(exp(0.014, 1), exp(0.006, 2), speed: [0.6] * 40)
    assert_equal plain.open(3, rate: 55, rng: Random.new(4)).to_h, slow.open(3, rate: 55, rng: Random.new(4)).to_h
  end

  def test_clustered_dips_lengthen_the_tail_near_capacity
    dips = Array.new(240) { |i| (i % 40) < 4 ? 0.6 : 1.0 } # 1 s at 60 % every 10 s
    steady = sim(exp(0.014, 1), exp(0.006, 2), n: 30_000)
    dipping = sim(exp(0.014, 1), exp(0.006, 2), n: 30_000, speed: dips)
    assert_equal steady.closed(3).to_h, dipping.closed(3).to_h, "closed loop ignores the speed"
    cap = steady.closed(3).rps
    heavy = [steady, dipping].map { |s| s.open(3, rate: 0.8 * cap, rng: Random.new(6)).latency_p99 }
    light = [steady, dipping].map { |s| s.open(3, rate: 0.3 * cap, rng: Random.new(6)).latency_p99 }
    assert_operator heavy[1], :>, heavy[0] * 1.2, "p99 at 80 %: #{heavy.inspect}"
    assert_operator light[1], :<, light[0] * 1.15, "p99 at 30 %: #{light.inspect}"
  end

  def test_speed_must_be_positive
    assert_raises(ArgumentError) { sim([0.01], [0.01], speed: []) }
    assert_raises(ArgumentError) { sim([0.01], [0.01], speed: [1.0, 0.0]) }
  end

  def test_scaled_lengthens_every_cpu_segment
    s = sim(exp(0.014, 1), exp(0.006, 2))
    assert_equal s.closed(3).to_h, s.scaled(1.0).closed(3).to_h
    assert_in_delta s.closed(3).rps / 1.1, s.scaled(1.1).closed(3).rps, s.closed(3).rps * 0.02, "GVL-bound: req/s ~ 1 / CPU"
    assert_raises(ArgumentError) { s.scaled(0) }
  end

  # Joined waits (Workload's link): request X sends (50 us), waits for the
  # GVL behind Y's 30 ms of CPU, holds it 10 us, then waits for the answer,
  # which the remote gives 50 ms after the send began. Played joined (-R),
  # X ends at 52 ms and its 30 ms wait for the GVL is not stall; played as
  # separate spans, the 50 ms answer would start after the GVL wait.
  def test_a_joined_wait_ends_with_the_remote
    x = [0.001, 0.00005, 0.00001, -0.05, 0.001]
    split = [0.001, 0.00005, 0.00001, 0.05 - 0.00006, 0.001]
    y = [0.03]
    joined = A::Simulation.new([x, y]).closed(2)
    apart = A::Simulation.new([split, y]).closed(2)
    assert_in_delta 0.052, joined.latency_p99, 0.0005, joined.to_h.inspect
    assert_in_delta 0.08195, apart.latency_p99, 0.001, apart.to_h.inspect
    assert_in_delta 0.001, joined.stall_max, 1e-6, "only Y's wait for X's first millisecond: #{joined.to_h.inspect}"
    assert_operator apart.stall_max, :>, 0.029
  end

  # The answer came while X still waited for the GVL: X asks again at once
  # (behind whoever asked meanwhile), and only the wait before the answer
  # is not stall.
  def test_a_joined_wait_that_ended_during_the_gvl_wait
    x = [0.001, 0.00005, 0.00001, -0.01, 0.001]
    y = [0.03]
    r = A::Simulation.new([x, y]).closed(2)
    # X: send at 1 ms, asks at 1.05 ms, GVL at 31 ms (Y), 10 us, asks again at
    # once (answer long in), runs 1 ms: ends at 32.01 ms; stall = 31 - 11 ms
    assert_in_delta 0.03201, r.latency_p99, 0.0002, r.to_h.inspect
    assert_in_delta 0.031 - 0.011, r.stall_max, 0.0002, r.to_h.inspect
  end

  # A database connection is held from the send until the answer: with one
  # connection, the second request's query waits for the first's whole R.
  def test_a_joined_wait_holds_its_connection_for_the_remote
    x = [0.001, 0.00005, 0.00001, -0.02, 0.001]
    r = A::Simulation.new([x, x], pool: 1).closed(2)
    assert_operator r.pool_wait_mean, :>, 0.009, r.to_h.inspect
  end
end
