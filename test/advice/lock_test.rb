# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"
require "serval/advice/table"
require "json"

# Waits for Ruby locks in the model (Advice::Lock, Simulation's `lock`):
# a local serialising resource, not I/O. Synthetic windows, fixed seeds:
# every figure is deterministic.
class AdviceLockTest < Minitest::Test
  A = Serval::Advice

  def profiles(run, io, waits: 1, n: 3000)
    A::Workload.new(run: [run], io: [io], io_waits: waits).profiles(n, Random.new(3))
  end

  # 1 ms of Ruby around a 10 ms wait: I/O overlaps, so 4 threads serve
  # about 4 times what one does; the same wait under one lock cannot
  # overlap, so 4 threads serve no more than 1 / 10 ms.
  def test_a_lock_serialises_what_io_overlaps
    prof = profiles(0.002, 0.010)
    io = A::Simulation.new(prof)
    locked = A::Simulation.new(prof, lock: 1.0)
    assert_operator io.closed(4).rps, :>, 3.5 * io.closed(1).rps
    assert_operator locked.closed(4).rps, :<, 1.05 / 0.010
    assert_in_delta io.closed(1).rps, locked.closed(1).rps, 1e-9, "one thread never waits for the lock"
    assert_equal 0.0, locked.closed(1).lock_wait_mean
    assert_nil io.closed(4).lock_wait_mean, "no lock modelled: no figure"
  end

  # CPU-bound requests whose short writes hold the lock: with more threads
  # the waits grow (the holder queues for the GVL before it unlocks, and a
  # woken waiter can lose the lock again to a thread that had the GVL
  # first, so the growth is not smooth with equal requests), and the lock
  # adds no throughput.
  def test_more_threads_wait_longer_for_the_lock
    prof = profiles(0.005, 0.0002, waits: 3)
    sim = A::Simulation.new(prof, lock: 1.0)
    waits = (2..6).map { |t| sim.closed(t).lock_wait_mean }
    assert_operator waits[3..].sum, :>, 3 * waits[0..1].sum, waits.inspect
    assert_operator waits.last, :>, 0.010, waits.inspect
    free = A::Simulation.new(prof)
    (1..6).each { |t| assert_operator sim.closed(t).rps, :<=, free.closed(t).rps * 1.001 }
  end

  # Ruby's Mutex hands nothing over (thread_sync.c): unlocking frees the
  # lock and wakes the first waiter, which must get the GVL before it can
  # take it, and a thread that has the GVL first takes it instead. Three
  # threads, equal requests of three 1 ms CPU segments around two locked
  # 10 us writes: the holders on the GVL keep taking the lock, so a
  # request waits about 1 ms for it and the median request takes 6 ms. A
  # hand-over to each waiter in turn makes every request wait 3 ms for
  # the lock and take 9 ms (the model before session 29).
  def test_unlocking_wakes_the_first_waiter_without_handing_it_the_lock
    prof = Array.new(60) { [0.001, 0.00001, 0.001, 0.00001, 0.001] }
    r = A::Simulation.new(prof, lock: 1.0, seed: 1).closed(3)
    assert_in_delta 0.00101, r.lock_wait_mean, 0.0002
    assert_operator r.latency_p50, :<, 0.008
    assert_equal 1.0, r.lock_waited
  end

  def test_the_lock_share_is_checked
    prof = profiles(0.001, 0.001)
    [0, -0.5, 1.5, Float::NAN].each do |bad|
      assert_raises(ArgumentError, bad.inspect) { A::Simulation.new(prof, lock: bad) }
    end
    assert_raises(ArgumentError) { A::Workload.new(run: [0.001], io: [0.001]).with_lock(2.0) }
    assert_raises(ArgumentError) { A::Simulation.new(prof, lock: 0.5, lock_within: 0) }
  end

  def test_a_smaller_share_waits_less
    prof = profiles(0.004, 0.0005, waits: 2)
    means = [0.125, 0.5, 1.0].map { |q| A::Simulation.new(prof, lock: q).closed(4).lock_wait_mean }
    means.each_cons(2) { |a, b| assert_operator b, :>, a, means.inspect }
  end

  # A CPU-bound app whose requests wait for a lock (Logger's monitor) at
  # 4 threads: 5 ms of Ruby, 0.3 ms of writes, ~3 ms of lock waits.
  def window(lock: true, lock_scale: 1.0, max_threads: 4)
    rng = Random.new(5)
    samples = Array.new(1500) do
      run = 0.004 + (rng.rand * 0.002)
      io = 0.0003
      held = rng.rand < 0.5 ? rng.rand * 0.012 * lock_scale : 0.0
      stall = 0.012
      s = { run: run, idle: io, stall: stall, wall: run + io + stall + held, shape: [run / 2, io, run / 2] }
      lock ? s.merge(lock: held) : s.merge(idle: io + held) # before: the lock wait was idle
    end
    { requests: 20_000, seconds: 60, max_threads: max_threads, gvl_split: true, samples: samples }
  end

  def test_lock_waits_are_not_io_and_the_advice_says_so
    after = A.recommend(window, sweep_max: 8, range: false, precision: false)
    before = A.recommend(window(lock: false), sweep_max: 8, range: false, precision: false)
    assert_operator after[:cpu_share], :>, 0.9
    assert_operator before[:cpu_share], :<, 0.7, "as idle, the lock waits read as I/O"
    assert_operator after[:threads], :<, before[:threads]
    l = after[:lock]
    assert_in_delta 0.003, l[:measured_mean], 0.0005
    assert_equal 4, l[:threads]
    refute_nil l[:share]
    assert l[:reproduced], l.inspect
    assert_in_delta l[:measured_mean], l[:simulated_mean], l[:measured_mean] * 0.65
    assert_kind_of Float, l[:predicted_mean]
    assert(after[:reasons].any? { |r| r.include?("Ruby locks") && r.include?("not I/O") }, after[:reasons].inspect)
    assert(after[:sweep].all? { |r| r[:lock_mean] })
    assert_nil before[:lock]
    assert(before[:sweep].none? { |r| r.key?(:lock_mean) })
    assert_equal after[:measured][:lock_mean].round(4), l[:measured_mean].round(4)
  end

  def test_longer_measured_waits_pick_a_larger_share
    shares = [0.1, 1.0].map do |k|
      A.recommend(window(lock_scale: k), sweep_max: 6, range: false, precision: false)[:lock][:share]
    end
    assert_operator shares[0], :<, shares[1], shares.inspect
  end

  def test_too_little_lock_is_reported_not_modelled
    a = A.recommend(window(lock_scale: 0.001), sweep_max: 6, range: false, precision: false)
    assert_nil a[:lock][:share]
    assert_nil a[:lock][:predicted_mean]
    assert(a[:reasons].any? { |r| r.include?("too little to model") }, a[:reasons].inspect)
    assert(a[:sweep].none? { |r| r.key?(:lock_mean) })
  end

  def test_no_thread_count_no_calibration
    a = A.recommend(window(max_threads: nil), sweep_max: 6, range: false, precision: false)
    assert_nil a[:lock][:share]
    assert(a[:reasons].any? { |r| r.include?("no thread count") }, a[:reasons].inspect)
  end

  # Requests with three short writes (a logger's: Started, Processing,
  # Completed) and one database round trip, at 6 threads and 333 req/s.
  # `waited` of them wait for the lock, `mean` seconds a request on average.
  def logger_window(waited:, mean:, seed: 5)
    rng = Random.new(seed)
    samples = Array.new(1500) do
      run = 0.0015 + (rng.rand * 0.001)
      send = 0.00002
      db = 0.002 + (rng.rand * 0.002)
      held = rng.rand < waited ? -Math.log(1 - rng.rand) * mean / waited : 0.0
      { run: run, idle: (3 * send) + db, stall: 0.001, lock: held, wall: run + (3 * send) + db + 0.001 + held,
        shape: [run / 5, send, run / 5, send, run / 5, db, run / 5, send, run / 5] }
    end
    { requests: 20_000, seconds: 60, max_threads: 6, gvl_split: true, samples: samples }
  end

  # The same mean lock wait, two kinds of lock: most requests waiting a
  # little (a logger's writes) against a few waiting long (a Mutex held
  # through a database call). The share that waited tells them apart.
  def test_the_share_that_waited_tells_a_loggers_lock_from_a_long_one
    logger = A.recommend(logger_window(waited: 0.7, mean: 0.0008), sweep_max: 8, range: false, precision: false)
    long = A.recommend(logger_window(waited: 0.08, mean: 0.0008), sweep_max: 8, range: false, precision: false)
    assert_equal :sends, logger[:lock][:held], logger[:lock].inspect
    assert_in_delta 0.0002, logger[:lock][:within], 1e-12
    assert_in_delta 0.7, logger[:lock][:measured_waited], 0.05
    assert logger[:lock][:reproduced], logger[:lock].inspect
    assert_equal :any, long[:lock][:held], long[:lock].inspect
    assert_nil long[:lock][:within]
    assert_operator long[:lock][:simulated_waited], :<, logger[:lock][:simulated_waited] / 3
    assert(logger[:reasons].any? { |r| r.include?("sends (waits of at most 200 us") }, logger[:reasons].inspect)
  end

  def test_the_text_shows_the_lock
    a = A.recommend(window, sweep_max: 6, range: false, precision: false)
    text = A::Table.render(JSON.parse(JSON.generate(a))) # as servalctl advise --from a saved answer
    assert_match(/threads\s+req\/s\s+gain\s+stall mean\s+lock mean\s+p50\s+p99/, text)
    assert_match(/lock waits \(Ruby locks, not I\/O\): \d+\.\d ms per request measured at 4 threads.*, \d+ % of requests waited/, text)
    assert_match(/modelled as one lock held through \d+ % of the waits: predicted \d+\.\d ms at \d+ threads/, text)
    logger = A.recommend(logger_window(waited: 0.7, mean: 0.0008), sweep_max: 6, range: false, precision: false)
    assert_match(/held through \d+ % of the sends \(a logger's writes\)/, A::Table.render(JSON.parse(JSON.generate(logger))))
  end

  def test_the_html_report_shows_the_lock
    require "serval/advice/report"
    w = window
    a = A.recommend(w, sweep_max: 6, range: false, precision: false)
    html = A::Report.new(a, window: w).html
    assert_includes html, A::Report::COLORS[:lock], "the lock in the mean split and the distribution"
    before = A.recommend(window(lock: false), sweep_max: 6, range: false, precision: false)
    refute_includes A::Report.new(before, window: window(lock: false)).html, A::Report::COLORS[:lock]
  end

  # The lock histogram calibrates the samples' lock as the other figures.
  def test_window_lock_figure
    w = window
    ours = w[:samples].sum { |s| s[:lock] } / w[:samples].size
    w[:histograms] = { lock: { bounds: [0.001, 0.01], counts: [10, 0, 10], sum: 20 * 1.5 * ours } }
    win = A::Window.new(w)
    assert_in_delta 1.5 * ours, win.calibrated.sum { |s| s[:lock] } / win.samples.size, 1e-9
    assert_in_delta win.workload.mean_io, 0.0003, 1e-9, "the I/O holds no lock wait"
  end
end
