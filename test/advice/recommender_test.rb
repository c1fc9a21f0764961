# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "serval/advice"

# The recommender from recorded windows: the answer for known workloads,
# the pool limit, processes, database connections, capacity, the JSON
# contract, and the honest answers (too little data, Ruby 3.1).
class AdviceRecommenderTest < Minitest::Test
  A = Serval::Advice
  MIB = 1 << 20
  MACHINE = { cpus: 2.0, cpu_source: "test", memory_bytes: 8 << 30, memory_source: "test", worker_bytes: 300 << 20 }.freeze
  FAST = { sim_requests: 8000, load_requests: 8000 }.freeze

  def self.exp(rng, mean) = -Math.log(1.0 - rng.rand) * mean

  # Paired per-request samples: run and idle (3.2+) with the given means.
  def self.samples(run, idle, n: 3000, random: true, seed: 7)
    rng = Random.new(seed)
    Array.new(n) do
      r = random ? exp(rng, run) : run
      i = random ? exp(rng, idle) : idle
      { run: r, idle: i, stall: 0.0, wall: r + i }
    end
  end

  def window(samples, **extra)
    { requests: 12_400, max_threads: 5, gvl_split: true, samples: samples }.merge(extra)
  end

  def advise(win, **opts) = A.recommend(win, machine: MACHINE, **FAST, **opts)

  # [name, samples, threads allowed, cpu share, max req/s per process (+-)]
  # Constant service times have exact answers (Puma's table: 70 % -> 2
  # threads at 71 req/s, 35 % -> 3 at 143); random ones need more threads.
  CASES = [
    ["70pct_constant", samples(0.014, 0.006, random: false), 2..2, 0.70, 71.4, 0.01],
    ["35pct_constant", samples(0.007, 0.013, random: false), 3..3, 0.35, 142.9, 0.01],
    ["35pct_exponential", samples(0.007, 0.013), 4..6, 0.35, 140.0, 0.06],
    ["10pct_exponential", samples(0.002, 0.018), 9..16, 0.10, 470.0, 0.1],
    ["90pct_exponential", samples(0.018, 0.002), 1..2, 0.90, 53.0, 0.08]
  ].freeze

  CASES.each do |name, samples, threads, share, rps, tol|
    define_method("test_#{name}") do
      r = advise(window(samples))
      assert r[:enough_data]
      assert_includes threads, r[:threads]
      assert_in_delta share, r[:cpu_share], 0.02
      assert_in_delta rps, r[:max_rps_per_process], rps * tol
      assert_equal 2, r[:processes]
      assert_in_delta 2 * r[:max_rps_per_process], r[:max_rps_per_machine], 0.02
      assert_equal r[:knee], r[:threads]
      sweep = r[:sweep]
      best = sweep.map { |row| row[:rps] }.max
      # the knee, exactly as the issue defines it
      assert_equal sweep.find { |row| row[:rps] >= 0.95 * best }[:threads], r[:threads]
      assert_equal 0.0, sweep.first[:stall_mean]
      assert_empty r[:warnings]
    end
  end

  def test_explanations_sit_beside_the_answer
    r = advise(window(self.class.samples(0.007, 0.013, random: false)))
    assert_equal 3, r[:gvl_ceiling][:threads]
    assert_in_delta 142.9, r[:gvl_ceiling][:max_rps], 0.1
    assert_equal 5, r[:amdahl][:pick] # Amdahl's < 5 % rule at p = 0.65 asks for more than the knee
    assert_equal 16, r[:amdahl][:table].size
    assert(r[:reasons].any? { |s| s.include?("Amdahl") })
    assert(r[:reasons].any? { |s| s.start_with?("throughput levels off at 3 threads") })
  end

  def test_histogram_window_agrees_with_samples
    samples = self.class.samples(0.007, 0.013)
    bounds = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1]
    hist = lambda do |key|
      counts = Array.new(bounds.size + 1, 0)
      samples.each { |s| counts[bounds.index { |b| s[key] <= b } || bounds.size] += 1 }
      { bounds: bounds, counts: counts, sum: samples.sum { |s| s[key] } }
    end
    from_hist = advise({ requests: 12_400, max_threads: 5, histograms: { run: hist.call(:run), idle: hist.call(:idle) } })
    from_samples = advise(window(samples))
    assert_in_delta from_samples[:threads], from_hist[:threads], 1
    assert_in_delta from_samples[:cpu_share], from_hist[:cpu_share], 0.005
    assert_in_delta from_samples[:max_rps_per_process], from_hist[:max_rps_per_process],
                    0.05 * from_samples[:max_rps_per_process]
  end

  def test_too_little_data_gives_no_numbers
    r = advise(window(self.class.samples(0.007, 0.013, n: 50), requests: 280))
    refute r[:enough_data]
    %i[threads processes cpu_share max_rps_per_process].each { |k| assert_nil r[k], k }
    assert_equal "280 requests measured, need 300", r[:warnings].first
    assert_equal 280, r[:requests]
    assert_equal 300, r[:needed]
    assert_equal "advice: 280 requests measured, need 300", r[:summary]
    # enough requests but almost none carry figures (a sampled Ruby 3.1 window)
    few = advise(window(self.class.samples(0.007, 0.013, n: 20)))
    refute few[:enough_data]
    assert_match(/\A20 of 12400 requests carry run\/idle figures, need 30/, few[:warnings].first)
  end

  def ruby31_window(threads)
    rng = Random.new(3)
    samples = Array.new(1500) do
      cpu = self.class.exp(rng, 0.007)
      { cpu: cpu, wall: cpu + self.class.exp(rng, 0.013) }
    end
    { requests: 30_000, max_threads: threads, gvl_split: false, ruby: "3.1.2", samples: samples }
  end

  def test_ruby31_uses_cpu_and_wall_and_always_says_so
    r = advise(ruby31_window(1))
    assert r[:enough_data]
    assert_in_delta 0.35, r[:cpu_share], 0.02
    assert_includes 4..6, r[:threads]
    assert_equal A::Recommender::RUBY31, r[:warnings].first
    assert_equal r[:threads], advise(ruby31_window(1).merge(gvl_split: 0))[:threads] # the stats' gauge
    short = advise(ruby31_window(1).merge(requests: 10))
    refute short[:enough_data]
    assert_includes short[:warnings], A::Recommender::RUBY31
  end

  def test_ruby31_stall_is_estimated_from_the_windows_load
    # a 3.1 window recorded at 4 threads and 100 req/s: wall - cpu holds the
    # I/O plus the stall the model predicts for that load
    rng = Random.new(3)
    pairs = Array.new(3000) { [self.class.exp(rng, 0.007), self.class.exp(rng, 0.013)] }
    stall = A::Simulation.new(A::Workload.new(pairs: pairs).profiles(20_000, Random.new(1))).open(4, rate: 100).stall_mean
    samples = pairs.map { |r, i| { cpu: r, wall: r + i + stall } }
    win = { requests: 6000, seconds: 60.0, max_threads: 4, gvl_split: false, samples: samples }
    truth = advise({ requests: 6000, samples: pairs.map { |r, i| { run: r, idle: i } } })
    raw = advise(win.merge(seconds: nil))
    corrected = advise(win)
    assert_operator raw[:threads], :>=, truth[:threads] + 2 # the stall taken for I/O asks for more threads
    assert_in_delta truth[:threads], corrected[:threads], 1
    assert_in_delta truth[:cpu_share], corrected[:cpu_share], 0.03
    assert_in_delta stall, corrected[:workload][:estimated_stall], stall * 0.3
    assert_equal A::Recommender::RUBY31, corrected[:warnings].first
    assert(corrected[:reasons].any? { |r| r.start_with?("Ruby 3.1: the model puts") })
  end

  def test_pool_binds
    samples = self.class.samples(0.007, 0.013)
    free = advise(window(samples, db_pools: [{ name: "primary", size: 10 }]))
    refute free[:pool][:binds]
    tight = advise(window(samples, db_pools: [{ name: "primary", size: 10 }, { name: "cache", size: 2 }]))
    assert tight[:pool][:binds]
    assert_equal "cache", tight[:pool][:name]
    assert_equal 2, tight[:threads]
    assert_equal free[:knee], tight[:knee]
    assert_operator tight[:pool][:pool_wait_if_unchanged], :>, 0
    assert_operator tight[:max_rps_per_process], :<, free[:max_rps_per_process]
    assert_match(/\Athe database pool binds: pool "cache" has 2 connections and the knee is #{free[:knee]} threads/,
                 tight[:warnings].first)
    assert_equal 2, tight[:database][:per_process]
  end

  def test_pool_wait_is_not_taken_for_io
    base = self.class.samples(0.007, 0.013)
    waited = base.map { |s| s.merge(idle: s[:idle] + 0.010, pool_wait: 0.010) }
    a = advise(window(base))
    b = advise(window(waited))
    assert_in_delta a[:cpu_share], b[:cpu_share], 1e-9
    assert_equal a[:threads], b[:threads]
    assert_in_delta 0.010, b[:measured][:pool_wait_mean], 1e-9
  end

  def test_processes_bounded_by_memory
    machine = { cpus: 8.0, cpu_source: "cgroup v2 cpu.max", memory_bytes: 2048 * MIB, memory_source: "cgroup v2 memory.max" }
    r = A.recommend(window(self.class.samples(0.007, 0.013)), machine: machine, worker_bytes: 600 * MIB, **FAST)
    assert_equal 2, r[:processes] # 2048 MiB x 0.8 / 600 MiB
    assert_equal "memory", r[:machine][:bound]
    assert_equal 8, r[:machine][:by_cpu]
    r = A.recommend(window(self.class.samples(0.007, 0.013)), machine: machine.merge(cpus: 1.5), **FAST)
    assert_equal 1, r[:processes]
    assert(r[:warnings].any? { |w| w.include?("PSS/USS") })
    none = A.recommend(window(self.class.samples(0.007, 0.013)), **FAST)
    assert_equal 1, none[:processes]
    assert_includes none[:warnings], "no machine facts: assuming one process"
  end

  def test_database_connections_for_a_fleet
    r = advise(window(self.class.samples(0.014, 0.006, random: false)), machines: 4, extra_connections: 10,
                                                                        db_max_connections: 20)
    db = r[:database]
    assert_equal [2, 4, 26], db.values_at(:per_process, :per_machine, :fleet) # 4 x 2 x 2 + 10
    refute db[:fits]
    assert_equal 2, db[:max_machines]
    assert(r[:warnings].any? { |w| w.include?("PgBouncer") && w.include?("at most 2 machines") })
    ok = advise(window(self.class.samples(0.014, 0.006, random: false)), machines: 4, db_max_connections: 100)
    assert ok[:database][:fits]
    refute(ok[:warnings].any? { |w| w.include?("PgBouncer") })
  end

  def test_capacity_at_a_target
    r = advise(window(self.class.samples(0.007, 0.013)), target_rps: 1000)
    c = r[:capacity]
    assert_operator c[:machines] * c[:processes] * r[:max_rps_per_process] * 0.8, :>=, 1000
    assert_operator (c[:machines] - 1) * c[:processes] * r[:max_rps_per_process] * 0.8, :<, 1000
    assert_equal r[:threads], c[:threads]
    assert_operator c[:latency_p99], :>=, c[:latency_p50]
    assert_operator c[:latency_p50], :>=, 0.015
    loads = r[:load]
    assert_equal [0.5, 0.8], loads.map { |l| l[:load] }
    assert_operator loads[1][:latency_p99], :>, loads[0][:latency_p99]
  end

  def test_stall_limit_lowers_threads
    samples = self.class.samples(0.007, 0.013)
    free = advise(window(samples))
    capped = advise(window(samples), stall_limit: 0.005)
    assert_operator capped[:threads], :<, free[:threads]
    assert_operator capped[:stall][:mean], :<=, 0.005
    assert(capped[:reasons].any? { |s| s.include?("stall under 5 ms") })
  end

  def test_measured_load_is_checked_against_the_model
    samples = self.class.samples(0.007, 0.013)
    r = advise(window(samples, seconds: 124.0)) # 100 req/s on 5 threads
    m = r[:measured]
    assert_in_delta 100.0, m[:rate], 1e-9
    assert_operator m[:predicted_stall_mean], :>, 0
    assert_operator m[:predicted_stall_mean], :<, r[:sweep][4][:stall_mean] # below saturation
    over = advise(window(samples, seconds: 31.0)) # 400 req/s: more than one process can do
    assert_nil over[:measured][:predicted_stall_mean]
    assert(over[:warnings].any? { |w| w.start_with?("the window's rate (400.0 req/s) is above") })
  end

  def test_json_contract
    r = JSON.parse(JSON.generate(advise(window(self.class.samples(0.007, 0.013)), target_rps: 500)))
    assert_kind_of Integer, r["threads"]
    assert_kind_of Integer, r["processes"]
    assert_kind_of Float, r["cpu_share"]
    assert r["cpu_share"].between?(0, 1)
    assert_kind_of Float, r["max_rps_per_process"]
    assert_kind_of Integer, r["requests"]
    assert_kind_of Array, r["warnings"]
    assert(r["warnings"].all? { |w| w.is_a?(String) })
    assert_match(/\Aadvice: \d+ threads(?: \(\d+-\d+\))? x 2 processes \(cpu share 0\.\d\d from 12,400 requests; running 5 threads/,
                 r["summary"])
  end

  # The window's cpu_speed: open-loop p99 replays the dips, the answer says
  # how unsteady the CPU was and warns when it often ran slow.
  def test_an_unsteady_cpu_lengthens_p99_under_load_and_is_reported
    win = window(self.class.samples(0.014, 0.006))
    steady = advise(win)
    dips = Array.new(240) { |i| (i % 40) < 4 ? 0.6 : 1.0 }
    unsteady = advise(win.merge(cpu_speed: dips))
    assert_nil steady[:cpu_steadiness]
    assert_equal({ steps: 240, below_0_9: 0.1, below_0_75: 0.1, p10: 0.96, min: 0.6 }, unsteady[:cpu_steadiness])
    assert_equal steady[:threads], unsteady[:threads], "throughput (and the knee) is a long-run mean"
    assert_equal steady[:max_rps_per_process], unsteady[:max_rps_per_process]
    assert_operator unsteady[:load].last[:latency_p99], :>, steady[:load].last[:latency_p99] * 1.2
    assert(unsteady[:warnings].any? { |w| w.include?("the CPU is unsteady: 10 %") }, unsteady[:warnings].inspect)
    assert(steady[:warnings].none? { |w| w.include?("unsteady") })
    calm = advise(win.merge(cpu_speed: Array.new(240) { |i| i.zero? ? 0.7 : 0.99 }))
    assert(calm[:warnings].none? { |w| w.include?("unsteady") }, "one slow step in 240 is no warning")
    assert_raises(ArgumentError) { advise(win.merge(cpu_speed: [1.0, -0.5])) }
  end

  # A window of under 30 s of busy steps: one pause of the machine would
  # stand for a tenth of the time, so its dips are reported but not
  # replayed - p99 under load as with a steady CPU.
  def test_a_short_speed_trace_is_reported_and_not_replayed
    win = window(self.class.samples(0.014, 0.006))
    steady = advise(win)
    short = advise(win.merge(cpu_speed: Array.new(40) { |i| i < 4 ? 0.6 : 1.0 }))
    assert_equal 40, short[:cpu_steadiness][:steps]
    assert_equal steady[:load], short[:load]
    assert(short[:reasons].any? { |r| r.include?("40 busy 0.25 s steps") && r.include?("too few to replay") },
           short[:reasons].inspect)
    long = advise(win.merge(cpu_speed: Array.new(120) { |i| i < 12 ? 0.6 : 1.0 }))
    assert_operator long[:load].last[:latency_p99], :>, steady[:load].last[:latency_p99] * 1.2, "120 steps: replayed"
  end

  # The window's sampling error: the same model with the mean GVL time per
  # request at the ends of its 95 % interval brackets the answer.
  def test_precision_brackets_max_rps_and_p99
    win = window(self.class.samples(0.014, 0.006, n: 1500))
    a = advise(win)
    pr = a[:precision]
    assert_equal 1500, pr[:samples]
    assert_in_delta 1.96 / Math.sqrt(1500), pr[:run_mean_within], 0.01, "exponential run times: sd = mean"
    lo, hi = pr[:max_rps_range]
    assert_operator lo, :<, a[:max_rps_per_process]
    assert_operator hi, :>, a[:max_rps_per_process]
    top = a[:load].max_by { |l| l[:load] }
    assert_equal top[:load], pr[:load][:load]
    fast, slow = pr[:load][:latency_p99_range]
    assert_operator fast, :<, top[:latency_p99]
    assert_operator slow, :>, top[:latency_p99]
    assert_operator slow / fast, :>, hi / lo, "near capacity p99 moves more than max req/s"
    assert(a[:reasons].any? { |r| r.start_with?("from 1,500 requests") }, a[:reasons].inspect)
    more = advise(window(self.class.samples(0.014, 0.006, n: 6000)))[:precision]
    assert_in_delta pr[:run_mean_within] / 2, more[:run_mean_within], 0.006, "four times the samples, half the interval"
    # samples taken at the run histogram's mean rest on the histogram's count
    runs = win[:samples].map { |s| s[:run] }
    hist = { bounds: [0.001, 0.01, 0.1], counts: [0, 6000, 0, 0], sum: runs.sum / runs.size * 6000 }
    counted = advise(win.merge(requests: 6000, histograms: { run: hist }))[:precision]
    assert_equal [1500, 6000], [counted[:samples], counted[:mean_of]]
    assert_in_delta pr[:run_mean_within] / 2, counted[:run_mean_within], 0.002
    assert_nil advise(win, precision: false)[:precision]
  end

  def test_same_window_same_advice_and_string_keys
    samples = self.class.samples(0.007, 0.013)
    a = advise(window(samples))
    b = advise(JSON.parse(JSON.generate(window(samples))))
    assert_equal a, b
  end

  def test_edge_workloads
    cpu_only = advise(window(Array.new(2000) { { run: 0.01, idle: 0.0 } }))
    assert_equal 1, cpu_only[:threads]
    assert_in_delta 100.0, cpu_only[:max_rps_per_process], 0.5
    assert_equal 1.0, cpu_only[:cpu_share]
    io_only = advise(window(Array.new(2000) { { run: 0.0, idle: 0.01 } }))
    assert_equal 16, io_only[:threads]
    assert_nil io_only[:gvl_ceiling][:max_rps]
    assert(io_only[:warnings].any? { |w| w.start_with?("throughput still grows at 16 threads") })
    JSON.generate(io_only)
    nothing = advise(window(Array.new(2000) { { run: 0.0, idle: 0.0 } }))
    refute nothing[:enough_data]
    assert_equal "the measured requests took no measurable time: nothing to model", nothing[:warnings].first
  end

  def test_bad_input
    assert_raises(ArgumentError) { A.recommend(window([]), bogus: 1) }
    assert_raises(ArgumentError) { A.recommend(window(Array.new(200) { { wall: 0.01 } })) }
    assert_raises(ArgumentError) { A.recommend("not a window") }
  end

  # An M/M/1 queue has an exact open-loop answer: one thread, exponential
  # CPU time of mean S and no I/O is one server, and at arrival rate L the
  # time in the system is exponential with rate 1/S - L, so
  # p99 = ln(100) / (1/S - L), S the window's mean run. The load points
  # (100,000 requests played) are within 3 % of it at 50 % and 80 % load.
  def test_load_point_p99_matches_an_m_m_1_queue
    win = window(self.class.samples(0.010, 0.0, n: 4000, seed: 11).map { |s| s.merge(idle: 0.0, wall: s[:run]) },
                 max_threads: 1)
    a = A.recommend(win, machine: MACHINE, sweep_max: 2, load_requests: 100_000)
    mean_run = a[:workload][:mean_run]
    a[:load].each do |point|
      exact = Math.log(100) / ((1 / mean_run) - point[:rate])
      assert_in_delta exact, point[:latency_p99], 0.06 * exact, "p99 at #{point[:load]} load: #{point.inspect}"
    end
  end
end
