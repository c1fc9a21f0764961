# frozen_string_literal: true

require_relative "test_helper"
require "timeout"
require "socket"
require "support/http_wire"
require "support/subprocess_server"
require "serval/request_timeout"

# request_timeout: a request running past it is answered 503 (504 behind a
# proxy header) at once with connection: close, whatever the app later
# returns is dropped, other clients are served, stats count it; with
# request_timeout_raise the thread gets Serval::RequestTimeout; a thread not
# back after the grace is reported stuck (cluster: its worker is replaced).
class RequestTimeoutTest < Minitest::Test
  include Serval::TestHelpers
  include Serval::HttpWire
  include Serval::SubprocessHelpers

  # A bounded Queue#pop (Queue#pop(timeout:) is Ruby 3.2+; on 3.1 the hash
  # reads as non_block and pops at once).
  def pop_within(queue, seconds)
    ::Timeout.timeout(seconds) { queue.pop }
  end

  TIMEOUT = 0.3

  def setup
    @release = Queue.new # the stuck app returns once this gets something
    @raised = Queue.new
    @peer, @never = UNIXSocket.pair # /io reads @peer: nothing arrives until release
  end

  def teardown
    [@peer, @never].each { |s| s.close unless s.closed? }
  end

  def release
    @release << true
    @never.write("x") unless @never.closed?
  end

  # /ruby: a busy Ruby loop; /sleep: a C call without the GVL; /io: a read
  # from a socket that never answers; /fast: answers at once.
  def app
    release = @release
    raised = @raised
    peer = @peer
    lambda do |env|
      case env["PATH_INFO"]
      when "/ruby"
        x = 0
        x += 1 while release.empty?
      when "/sleep"
        sleep 0.01 while release.empty?
      when "/io"
        peer.read(1) # blocks in I/O until the test releases it
      when "/slow-ok"
        env[Serval::RequestTimeoutWatchdog::ENV_KEY] = 5
        sleep 0.6
      end
      [200, { "content-type" => "text/plain" }, ["late #{env['PATH_INFO']}"]]
    rescue Serval::RequestTimeout => e
      raised << e
      raise
    end
  end

  def timed(&block)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    result = block.call
    [result, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t]
  end

  def serve(**opts, &block)
    with_server(app, request_timeout: TIMEOUT, request_timeout_grace: 30.0, min_threads: 4, max_threads: 4, **opts, &block)
  end

  %w[/ruby /sleep /io].each do |path|
    define_method("test_stuck_in_#{path.delete('/')}_is_answered_503_at_once") do
      serve do |server, port|
        client = connect(port)
        response, took = timed do
          client.write(get(path))
          client.read_response
        end
        assert_equal 503, response.status
        assert_equal "close", response["connection"]
        assert_match(/request_timeout/, response.body)
        assert_operator took, :<, TIMEOUT + 1.0
        assert client.wait_close, "the connection closes"
        assert_equal 200, http(port, get("/fast")).status, "other clients are served meanwhile"
        assert_equal 1, server.stats[:request_timeouts]
        keep = connect(port) # a keep-alive connection the late response must never reach
        keep.write(get("/fast"))
        assert_equal "late /fast", keep.read_response.body
        release # the app's late response goes nowhere
        3.times do
          keep.write(get("/fast"))
          assert_equal "late /fast", keep.read_response.body
        end
      end
    end
  end

  # The limit counts from when the request was queued: one that waited its
  # whole limit for the only thread is answered 503 as soon as it is taken.
  def test_time_waiting_for_a_thread_counts
    serve(min_threads: 1, max_threads: 1) do |server, port|
      stuck = connect(port)
      stuck.write(get("/sleep"))
      assert_equal 503, stuck.read_response.status
      waiting = connect(port)
      waiting.write(get("/fast")) # queued behind the stuck request
      assert waiting.silent_for?(TIMEOUT * 1.5), "no thread free yet"
      release
      assert_equal 503, waiting.read_response.status
      assert_equal 2, server.stats[:request_timeouts]
    end
  end

  def test_proxied_request_gets_504
    serve do |_server, port|
      response = http(port, get("/sleep", { "X-Forwarded-For" => "10.0.0.1" }))
      assert_equal 504, response.status
      release
    end
  end

  def test_the_app_can_give_a_request_more_time
    serve do |server, port|
      response = http(port, get("/slow-ok"))
      assert_equal 200, response.status
      assert_equal "late /slow-ok", response.body
      assert_equal 0, server.stats[:request_timeouts]
    end
  end

  def test_raise_interrupts_the_thread_and_the_pool_recovers
    serve(request_timeout_raise: true, min_threads: 1, max_threads: 1) do |_server, port|
      assert_equal 503, http(port, get("/ruby")).status
      assert_instance_of Serval::RequestTimeout, pop_within(@raised, 5)
      assert_equal 200, http(port, get("/fast")).status, "the one thread serves again"
    end
  end

  # The watchdog's raise reaches a request's thread only while that request
  # is its own: one expired after it ended never hits the thread's next one.
  # expire runs the given block (in the watchdog's thread, just before its
  # raise would come) and answers true.
  FakeRequest = Struct.new(:on_expire, :expired) do
    def expire(_status, _message)
      on_expire&.call
      self.expired = true
    end
  end

  def test_a_raise_never_reaches_the_threads_next_request
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
    dog = Serval::RequestTimeoutWatchdog.new(timeout: 1, raise_in_thread: true, grace: 30, log_writer: log)
    registered = Queue.new
    finish = Queue.new
    finished = Queue.new
    next_request = Queue.new
    got = Queue.new
    # the request ends between the watchdog's look at it and its raise
    request = FakeRequest.new(lambda {
      finish << true
      pop_within(finished, 5)
    })
    worker = Thread.new do
      dog.watch(request, { "PATH_INFO" => "/old" })
      registered << true
      finish.pop
      dog.done
      finished << true
      next_request.pop # the thread's next request: nothing may be raised here
      got << :clean
    rescue Serval::RequestTimeout => e
      got << e
    end
    pop_within(registered, 5)
    dog.check(Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10)
    next_request << true
    assert_equal :clean, pop_within(got, 5)
    worker.join(5)
    dog.watch(req = FakeRequest.new, { "PATH_INFO" => "/mine" }) # the current thread, still in its request
    assert_raises(Serval::RequestTimeout) do
      Thread.handle_interrupt(Serval::RequestTimeout => :immediate) do
        dog.check(Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10)
        sleep 5 # interrupted at once by the pending raise
      end
    end
    assert req.expired
  end

  def test_off_by_default
    with_server(app, min_threads: 2, max_threads: 2) do |server, port|
      client = connect(port)
      client.write(get("/sleep"))
      assert client.silent_for?(TIMEOUT * 2), "no answer from a timeout that is off"
      release
      assert_equal 200, client.read_response.status
      refute server.stats.key?(:request_timeouts)
      refute(Thread.list.any? { |t| t.name == "serval-timeout" })
    end
  end

  def test_stuck_thread_after_grace_asks_for_replacement
    asked = Queue.new
    serve(request_timeout_grace: 0.2, replace_me: ->(reason) { asked << reason }) do |server, port|
      assert_equal 503, http(port, get("/sleep")).status
      assert_match(%r{stuck request: GET /sleep}, pop_within(asked, 5))
      assert_equal 1, server.stats[:stuck_threads]
      release
    end
  end

  def test_bad_values_are_refused
    [["request_timeout(-1)", /request_timeout/], ["request_timeout_grace(-2)", /request_timeout_grace/],
     ["request_timeout_raise 3", /request_timeout_raise/]].each do |line, pattern|
      assert_match pattern, assert_raises(Serval::ConfigError) { config_from("#{line}\n") }.message
    end
  end

  STUCK_APP = <<~RUBY
    run lambda { |env|
      sleep 0.05 until File.exist?("release") if env["PATH_INFO"] == "/stuck"
      [200, {"content-type" => "text/plain"}, ["\#{Process.pid}"]]
    }
  RUBY

  def test_cluster_worker_with_a_stuck_thread_is_replaced
    config = "bind 'tcp://127.0.0.1:0'\nthreads 2, 2\nworkers 1\nworker_check_interval 0.2\n" \
             "request_timeout 0.3\nrequest_timeout_grace 0.3\ndrain_timeout 1\n"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => STUCK_APP, "c.rb" => config }).boot
    server.wait_for(/Worker 0 \(PID: (\d+)\) booted/)
    first = http(server.port, get("/")).body
    assert_equal 503, http(server.port, get("/stuck")).status
    server.wait_for(/Worker 0 \(PID: #{first}\) recycled: asked: stuck request: GET \/stuck/, timeout: 10)
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 2, timeout: 15)
    server.wait_for(/Worker 0 \(PID: #{first}\) stopped/, timeout: 15)
    refute_equal first, http(server.port, get("/")).body
  end
end
