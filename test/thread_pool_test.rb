# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"

# The worker thread pool: names, MIN:MAX growth, resizing at run time and
# graceful stop. Apps block on Queues so that "N requests in flight" is a
# known state, never a timing guess.
class ThreadPoolTest < Minitest::Test
  include Serval::HttpWire

  # An app that reports each request's thread to `started`, then waits for
  # one token from `release` (a token may carry a body).
  def blocking_app(started, release)
    lambda do |env|
      started << [Thread.current, env["PATH_INFO"]]
      body = release.pop
      [200, { "content-type" => "text/plain" }, [body.is_a?(String) ? body : "done #{env['PATH_INFO']}"]]
    end
  end

  def send_requests(port, count, prefix = "/r")
    count.times.map do |i|
      client = connect(port, timeout: 10)
      client.write("GET #{prefix}#{i} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      client
    end
  end

  # Prepends a hook to the server's core so the test knows when #drain ran.
  def on_drain(server)
    drained = Queue.new
    core = server.instance_variable_get(:@core)
    core.singleton_class.prepend(Module.new { define_method(:drain) { super().tap { drained << true } } })
    drained
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # An idle worker keeps nothing of the request it served last: a thread idle
  # for seconds kept a Rails request's graph alive into the old generation
  # (major GCs, bench/NOTES.md "Session 27"). Checked where it waits: each
  # time a worker reaches its `@core.next` line after a request, its
  # `request` local must be nil (a line TracePoint on ThreadPool#work). Not
  # with GC and WeakRefs: the GC scans a waiting thread's machine stack
  # conservatively, and a stale copy of an app's object there (one its own
  # C calls left) kept payloads alive in some runs (bench/NOTES.md
  # "Session 28").
  def test_an_idle_worker_keeps_nothing_of_its_last_request
    require "serval/thread_pool"
    work = Serval::ThreadPool.instance_method(:work)
    file, = work.source_location
    line = File.readlines(file).index { |l| l.include?("request = @core.next(wait)") } + 1
    held = Queue.new
    trace = TracePoint.new(:line) do |tp|
      held << tp.binding.local_variable_get(:request).class if tp.lineno == line && tp.path == file
    end
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    with_server(app, min_threads: 2, max_threads: 2) do |server, port|
      trace.enable(target: work)
      begin
        3.times { assert_equal 200, http(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").status }
        assert wait_for_idle(server), "the pool went idle"
        seen = Array.new(3) { held.pop }
      ensure
        trace.disable
      end
      assert_equal [NilClass] * 3, seen, "a worker waited for its next request holding its last one"
    end
  end

  # The same for what the app registers in rack.response_finished and
  # rack.after_reply (Rails' executor closes over its env there): once run,
  # both Arrays are empty, so a stale copy of one on an idle worker's machine
  # stack keeps no closure alive (on Campfire each idle worker kept a
  # controller that way). Deterministic: the app keeps its env and looks.
  def test_run_callbacks_are_dropped_once_run
    kept = Queue.new
    ran = Queue.new
    app = lambda do |env|
      payload = Array.new(10) { |i| "payload #{i}" }
      env["rack.response_finished"] << ->(*) { ran << payload.size }
      env["rack.after_reply"] << -> { ran << payload.size }
      kept << env
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(app, min_threads: 2, max_threads: 2, lint: false) do |server, port|
      assert_equal 200, http(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").status
      assert_equal [10, 10], [ran.pop, ran.pop], "both callbacks ran"
      env = kept.pop
      assert wait_for_idle(server), "the pool went idle"
      assert_equal [[], []], [env["rack.response_finished"], env["rack.after_reply"]]
    end
  end

  def wait_for_idle(server)
    deadline = now + 5
    Thread.pass until server.thread_pool.busy.zero? || now > deadline
    server.thread_pool.busy.zero?
  end

  def test_worker_threads_are_named
    names = Queue.new
    app = ->(_env) { names << Thread.current.name && [200, {}, ["ok"]] }
    with_server(app, min_threads: 2, max_threads: 4) do |server, port|
      assert_equal 200, http(port, get("/", { "Connection" => "close" })).status
      assert_match(/\Aserval-worker-\d+\z/, names.pop)
      pool = Thread.list.select { |t| t.name&.start_with?("serval-worker-") }
      assert_operator pool.size, :>=, 2
      assert_equal pool.size, pool.map(&:name).uniq.size, "names are unique"
      assert_equal 2, server.thread_pool.min
    end
  end

  # 5 concurrent blocked requests with -t 1:3: exactly 3 run at once, on 3
  # threads, and the other 2 are served later by those same threads.
  def test_pool_grows_to_max_and_no_further
    started = Queue.new
    release = Queue.new
    with_server(blocking_app(started, release), min_threads: 1, max_threads: 3) do |server, port|
      clients = send_requests(port, 5)
      first = Array.new(3) { started.pop.first }
      assert_equal 3, first.uniq.size, "three requests run on three threads"
      assert_equal 3, server.thread_pool.spawned
      assert_equal 3, server.thread_pool.busy
      5.times { release << :go }
      later = Array.new(2) { started.pop.first }
      clients.each { |c| assert_equal 200, c.read_response.status }
      assert_equal 3, (first + later).uniq.size, "never more than max threads"
      assert_operator server.thread_pool.spawned, :<=, 3
      assert_equal 3, server.stats[:max_threads]
    end
  end

  def test_min_threads_are_started_up_front
    with_server(->(_env) { [200, {}, ["ok"]] }, min_threads: 3, max_threads: 5) do |server, _port|
      assert_equal 3, server.thread_pool.spawned
    end
  end

  # resize(min, max) at run time: growing lets queued requests start at once;
  # shrinking retires the surplus threads once their requests are done.
  def test_resize_grows_and_shrinks_at_run_time
    started = Queue.new
    release = Queue.new
    with_server(blocking_app(started, release), min_threads: 1, max_threads: 1) do |server, port|
      clients = send_requests(port, 3)
      first = started.pop.first
      server.thread_pool.resize(1, 3) # the two queued requests must start now
      threads = [first] + Array.new(2) { started.pop.first }
      assert_equal 3, threads.uniq.size
      assert_equal [1, 3], [server.thread_pool.min, server.thread_pool.max]

      server.thread_pool.resize(1, 1)
      exited = Queue.new
      watchers = threads.map { |t| Thread.new { t.join && exited << t } }
      3.times { release << :go }
      clients.each { |c| assert_equal 200, c.read_response.status }
      2.times { exited.pop } # two surplus threads leave after their request
      assert_equal 1, server.thread_pool.spawned

      # one thread left: three new requests are served one after another by it
      clients = send_requests(port, 3, "/s")
      runner = started.pop.first
      assert runner.alive?
      assert_equal 1, server.thread_pool.spawned
      release << :go
      assert_same runner, started.pop.first
      release << :go
      assert_same runner, started.pop.first
      release << :go
      clients.each { |c| assert_equal 200, c.read_response.status }
      watchers.each(&:kill)
    end
  end

  def test_resize_rejects_bad_values
    with_server(->(_env) { [200, {}, ["ok"]] }) do |server, _port|
      assert_raises(ArgumentError) { server.thread_pool.resize(3, 2) }
      assert_raises(ArgumentError) { server.thread_pool.resize(0, 0) }
    end
  end

  # stop(timeout) while a request is blocked in the app: new connections are
  # not served, the in-flight request completes and its client receives the
  # whole (1 MB) response, then stop returns.
  def test_graceful_stop_drains_an_in_flight_request
    started = Queue.new
    release = Queue.new
    seen = Queue.new
    app = lambda do |env|
      seen << env["PATH_INFO"]
      blocking_app(started, release).call(env)
    end
    body = "x" * 1_000_000
    late = nil
    with_server(app, max_threads: 2) do |server, port|
      drained = on_drain(server)
      client = connect(port, timeout: 10)
      client.write("GET /inflight HTTP/1.1\r\nHost: h\r\n\r\n")
      started.pop
      assert_equal "/inflight", seen.pop
      stopper = Thread.new { server.stop(10) }
      drained.pop
      late = Thread.new do
        raw_request(port, "GET /late HTTP/1.1\r\nHost: h\r\n\r\n", read_timeout: 10)
      rescue Errno::ECONNREFUSED, Errno::ECONNRESET
        "" # refused once the listeners are closed: not served either way
      end
      release << body
      res = client.read_response
      assert_equal 200, res.status
      assert_equal ["close"], res.values("connection"), "a draining server closes after the response"
      assert res.body == body, "the whole body arrives"
      assert client.closed_by_peer?
      stopper.join
    end
    assert_equal "", late.value, "a connection made after stop began is not served"
    assert seen.empty?, "the late request never reached the app"
  end

  # Once stop has begun (drain acknowledged by the loop), the listening socket
  # is closed: a new client is refused outright instead of waiting in a backlog.
  def test_new_connections_are_refused_once_stop_begins
    started = Queue.new
    release = Queue.new
    with_server(blocking_app(started, release), max_threads: 1) do |server, port|
      drained = on_drain(server)
      client = connect(port, timeout: 10)
      client.write("GET /inflight HTTP/1.1\r\nHost: h\r\n\r\n")
      started.pop
      stopper = Thread.new { server.stop(10) }
      drained.pop
      deadline = now + 5
      refused = false
      until refused || now > deadline
        begin
          TCPSocket.new("127.0.0.1", port).close
          Thread.pass
        rescue Errno::ECONNREFUSED
          refused = true
        end
      end
      assert refused, "connections are refused while the server drains"
      release << "done"
      assert_equal 200, client.read_response.status
      stopper.join
    end
  end

  # A request still running when the stop timeout passes is cut off: stop
  # returns within timeout + a small margin and the client's connection closes.
  def test_stop_cuts_off_a_request_that_exceeds_the_timeout
    started = Queue.new
    never = Queue.new
    with_server(blocking_app(started, never), max_threads: 2) do |server, port|
      client = connect(port, timeout: 10)
      client.write("GET /stuck HTTP/1.1\r\nHost: h\r\n\r\n")
      started.pop
      t0 = now
      server.stop(0.5)
      elapsed = now - t0
      assert_operator elapsed, :>=, 0.45
      assert_operator elapsed, :<, 2.0, "stop took #{elapsed}s"
      assert client.closed_by_peer?, "the cut-off request's connection is closed"
      assert_empty client.buffered
      assert_equal 0, server.thread_pool.spawned
    end
    assert_includes @server_log_writer.stderr.string, "still running"
  end

  def test_stop_is_idempotent_and_returns_quickly_when_idle
    with_server(->(_env) { [200, {}, ["ok"]] }) do |server, port|
      assert_equal 200, http(port, get("/", { "Connection" => "close" })).status
      t0 = now
      server.stop(5)
      server.stop(5)
      assert_operator now - t0, :<, 2.0
    end
  end
end
