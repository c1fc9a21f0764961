# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "monitor"
require "serval/timing"

# Waits for Ruby locks are told from I/O (Ruby 3.3+: ext/serval/gvl.c reads
# the resumed thread's top frames): a request blocked on a Mutex, a Monitor
# or a Queue gets `lock` time in serval.timing, not idle; a request blocked
# on a pipe keeps it idle. Before 3.3, lock is nil and the wait stays idle.
class LockWaitTest < Minitest::Test
  include Serval::HttpWire

  HOLD = 0.1 # seconds the other thread keeps the lock once the request is blocked on it

  def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def split? = Serval::Native::GVL.lock_split?

  # The request thread, once it is blocked (status "sleep": waiting on the
  # lock, or the pipe), then HOLD more, then `release` runs. Bounded by the
  # test's timeout.
  def after_blocked(blocked, &release)
    Thread.new do
      th = blocked.pop
      Thread.pass until th.status == "sleep" || !th.alive?
      sleep HOLD # the wait's length, not a synchronisation: the thread is already blocked
      release.call
    end
  end

  # Another thread holds lock (a Mutex or Monitor) until `go` is pushed.
  def hold(lock)
    inside = Queue.new
    go = Queue.new
    holder = Thread.new { lock.synchronize { inside << true; go.pop } }
    inside.pop
    [holder, go]
  end

  # Serves one request whose app runs `wait` (which blocks), returns
  # [timing Hash, the app's own clock around the wait, log fields, stats].
  def serve(wait)
    seen = Queue.new
    app = lambda do |env|
      t0 = clock
      wait.call
      own = clock - t0
      env["rack.response_finished"] << ->(e, *) { seen << [e["serval.timing"].to_h, own, e["serval.timing"].log_fields] }
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(app, timing_sample_rate: 1.0, max_threads: 1) do |server, port|
      res = http(port, "GET /locked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status
      t, own, log = seen.pop
      [t, own, log, server.stats[:timing]]
    end
  end

  # The wait is lock (3.3+) or idle (before), within what the app saw.
  def assert_lock_wait(t, own, log)
    if split?
      assert_operator t[:lock], :>=, HOLD * 0.9, t.inspect
      assert_operator t[:lock], :<=, own + 0.001, t.inspect
      assert_operator t[:idle], :<, HOLD / 2, t.inspect
      assert_in_delta t[:wall], t[:run] + t[:idle] + t[:stall] + t[:lock], [0.002, t[:wall] * 0.02].max, t.inspect
      assert_in_delta t[:idle] + t[:stall] + t[:lock], t[:wait], 1e-6
      assert_match(/ stall=\d+\.\d\d lock=\d+\.\d\d$/, log)
    else
      assert_nil t[:lock]
      refute_match(/lock=/, log)
      assert_operator t[:idle] || t[:wait] || t[:wall], :>=, HOLD * 0.9, t.inspect
    end
  end

  def test_a_request_waiting_on_a_mutex_gets_lock_time
    m = Mutex.new
    held = Queue.new
    blocked = Queue.new
    holder, go = hold(m)
    releaser = after_blocked(blocked) { go << :go }
    t, own, log, stats = serve(lambda do
      blocked << Thread.current
      m.synchronize { held << true }
    end)
    releaser.join
    holder.join
    assert_equal true, held.pop
    assert_lock_wait(t, own, log)
    if split?
      h = stats.fetch("request_lock_seconds")
      assert_equal 1, h[:count]
      assert_in_delta t[:lock], h[:sum], 1e-9
      assert_in_delta t[:lock], stats.fetch("request_lock_seconds_total")[:value], 1e-9
    else
      refute stats.key?("request_lock_seconds")
    end
  end

  # Logger's LogDevice is a MonitorMixin: the same wait as Monitor#synchronize.
  def test_a_request_waiting_on_a_monitor_gets_lock_time
    mon = Monitor.new
    holder, go = hold(mon)
    blocked = Queue.new
    releaser = after_blocked(blocked) { go << :go }
    t, own, log, = serve(lambda do
      blocked << Thread.current
      mon.synchronize { nil }
    end)
    releaser.join
    holder.join
    assert_lock_wait(t, own, log)
  end

  def test_a_request_waiting_on_a_queue_gets_lock_time
    q = Queue.new
    blocked = Queue.new
    releaser = after_blocked(blocked) { q << :item }
    t, own, log, = serve(lambda do
      blocked << Thread.current
      assert_equal :item, q.pop
    end)
    releaser.join
    assert_lock_wait(t, own, log)
  end

  def test_a_request_waiting_on_a_condition_variable_gets_lock_time
    m = Mutex.new
    cv = ConditionVariable.new
    ready = false
    blocked = Queue.new
    releaser = after_blocked(blocked) do
      m.synchronize do
        ready = true
        cv.signal
      end
    end
    t, own, log, = serve(lambda do
      blocked << Thread.current
      m.synchronize { cv.wait(m) until ready }
    end)
    releaser.join
    assert_lock_wait(t, own, log)
  end

  # I/O stays idle: a pipe read, and a plain sleep.
  def test_io_and_sleep_stay_idle
    r, w = IO.pipe
    blocked = Queue.new
    releaser = after_blocked(blocked) { w.write("x") }
    t, own, log, = serve(lambda do
      blocked << Thread.current
      r.read(1)
      sleep 0.02
    end)
    releaser.join
    assert_operator t[:idle] || t[:wait], :>=, [HOLD * 0.9, own - 0.01].min, t.inspect
    if split?
      assert_operator t[:lock], :<, 0.001, t.inspect
      refute_match(/lock=/, log)
    else
      assert_nil t[:lock]
    end
  ensure
    r&.close
    w&.close
  end

  # The window's samples carry lock (Timing::Window, what /window and
  # servalctl advise read).
  def test_the_window_samples_carry_lock
    skip "lock waits are told apart on Ruby 3.3+" unless split?

    m = Mutex.new
    blocked = Queue.new
    holder, go = hold(m)
    releaser = after_blocked(blocked) { go << :go }
    Serval::Timing.window_reset
    serve(lambda do
      blocked << Thread.current
      m.synchronize { nil }
    end)
    releaser.join
    holder.join
    window = Serval::Timing::Window.read
    locked = window[:samples].select { |s| s[:lock] }
    assert_equal 1, locked.size, window[:samples].inspect
    assert_operator locked[0][:lock], :>=, HOLD * 0.9
    assert_in_delta locked[0][:lock], window[:histograms][:lock][:sum], 1e-6
  end
end
