# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# The hand-offs of a request's hot path (docs/DESIGN.md "A request's path"):
# a queued request wakes exactly one sleeping thread (ext/serval/conn.c), and
# a plain connection stays registered, edge-triggered, so input or a close
# that arrives while the app runs is noted and handled once the response is
# done (ext/serval/loop.c).
class HotPathTest < Minitest::Test
  include Serval::HttpWire

  H = "Host: example.test\r\n"

  # /block* report to `started` and wait for a token from `release`; every
  # path answers "PATH on THREAD".
  def gate_app(started, release)
    lambda do |env|
      path = env["PATH_INFO"]
      if path.start_with?("/block")
        started << path
        release.pop
      end
      [200, { "content-type" => "text/plain" }, ["#{path} on #{Thread.current.name}"]]
    end
  end

  def get(path, extra = "")
    "GET #{path} HTTP/1.1\r\n#{H}#{extra}\r\n"
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def core_stats_until(server, timeout: 10)
    deadline = now + timeout
    loop do
      s = server.core.stats
      return s if yield(s) || now > deadline

      sleep 0.01
    end
  end

  # The running thread is blocked in the app (without the GVL) and takes no
  # more requests: the ones queued meanwhile go to the sleeping thread.
  def test_requests_behind_a_blocked_thread_go_to_the_sleeping_one
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 2, max_threads: 2) do |_server, port|
      blocked = connect(port).write(get("/block"))
      assert_equal "/block", started.pop
      blocker = nil
      3.times do |i|
        client = connect(port).write(get("/fast#{i}", "Connection: close\r\n"))
        body = client.read_response.body
        assert_match(%r{\A/fast#{i} on serval-worker-\d+\z}, body)
        blocker = body[/serval-worker-\d+/]
        client.close
      end
      release << :go
      body = blocked.read_response.body
      refute_equal blocker, body[/serval-worker-\d+/], "served by the other thread"
      blocked.close
    end
  end

  # Once the traffic stops, every thread is back asleep in Core#next and none
  # counts as woken (a woken count that leaked would hide a sleeping thread).
  def test_every_thread_sleeps_again_once_traffic_stops
    app = ->(env) { [200, { "content-type" => "text/plain" }, [env["PATH_INFO"]]] }
    with_server(app, min_threads: 4, max_threads: 4) do |server, port|
      clients = Array.new(6) { connect(port) }
      25.times do |i|
        clients.each { |c| c.write(get("/r#{i}")) }
        clients.each { |c| assert_equal "/r#{i}", c.read_response.body }
      end
      clients.each(&:close)
      s = core_stats_until(server) { |st| st[:waking].zero? && st[:waiting] == 4 }
      assert_equal [0, 0, 4], s.values_at(:waking, :queued, :waiting)
    end
  end

  # A request written while the app runs on the same connection (its edge
  # comes while a Ruby thread owns the connection) is answered next.
  def test_request_sent_while_the_app_runs_is_answered_after_it
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1) do |_server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      client.write(get("/second"))
      release << :go
      assert_match(%r{\A/block1 on }, client.read_response.body)
      assert_match(%r{\A/second on }, client.read_response.body)
      assert client.silent_for?(0.1), "exactly two responses"
      client.close
    end
  end

  # Half a head arrives while the app runs, the rest after the response:
  # the connection reads both parts.
  def test_head_split_around_a_response_is_read_whole
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1) do |_server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      client.write("GET /sec")
      release << :go
      assert_match(%r{\A/block1 on }, client.read_response.body)
      client.write("ond HTTP/1.1\r\n#{H}\r\n")
      assert_match(%r{\A/second on }, client.read_response.body)
      client.close
    end
  end

  # More pipelined requests than one read takes (over 4 KiB) arrive while
  # the app runs: every one is answered, in order.
  def test_a_pipelined_burst_sent_while_the_app_runs_is_answered_in_order
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1) do |_server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      wire = (1..150).map { |i| get("/p#{i}", "X-Pad: #{'x' * 40}\r\n") }.join
      assert_operator wire.bytesize, :>, 8192
      client.write(wire)
      release << :go
      assert_match(%r{\A/block1 on }, client.read_response.body)
      (1..150).each { |i| assert_match(%r{\A/p#{i} on }, client.read_response.body) }
      assert client.silent_for?(0.1)
      client.close
    end
  end

  # The client leaves while its request runs: the response finds the close
  # and the connection is gone afterwards.
  def test_client_gone_while_the_app_runs_closes_the_connection
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1) do |server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      client.close
      release << :go
      s = core_stats_until(server) { |st| st[:connections].zero? }
      assert_equal 0, s[:connections]
      fresh = connect(port).write(get("/after", "Connection: close\r\n"))
      assert_match(%r{\A/after on }, fresh.read_response.body)
      fresh.close
    end
  end

  # The peer's FIN can come in the same edge as its last bytes (both in the
  # socket before the loop reads): a short read then leaves the end of
  # input unannounced. The loop must still see it and close at once, not at
  # read_timeout / persistent_timeout (which are long here).
  LONG_WAITS = { first_data_timeout: 30, read_timeout: 30, persistent_timeout: 30 }.freeze

  def test_half_a_head_and_a_close_in_one_edge_close_at_once
    app = ->(env) { [200, { "content-type" => "text/plain" }, [env["PATH_INFO"]]] }
    with_server(app, min_threads: 1, max_threads: 1, **LONG_WAITS) do |server, port|
      clients = Array.new(5) do
        client = connect(port).write("GET /half HTTP/1.1\r\nHo")
        client.socket.close_write
        client
      end
      clients.each { |c| assert_equal :eof, c.wait_close(timeout: 2) }
      s = core_stats_until(server, timeout: 2) { |st| st[:connections].zero? }
      assert_equal 0, s[:connections]
      clients.each(&:close)
    end
  end

  def test_a_request_and_a_close_in_one_edge_are_answered_then_closed
    app = ->(env) { [200, { "content-type" => "text/plain" }, [env["PATH_INFO"]]] }
    with_server(app, min_threads: 1, max_threads: 1, **LONG_WAITS) do |server, port|
      clients = Array.new(5) do |i|
        client = connect(port).write(get("/r#{i}"))
        client.socket.close_write
        client
      end
      clients.each_with_index do |c, i|
        assert_equal "/r#{i}", c.read_response.body
        assert_equal :eof, c.wait_close(timeout: 2)
      end
      s = core_stats_until(server, timeout: 2) { |st| st[:connections].zero? }
      assert_equal 0, s[:connections]
      clients.each(&:close)
    end
  end

  # A request and the client's FIN arrive while the app runs (the event is
  # noted, not handled): after both responses the connection closes at once.
  def test_a_request_and_a_close_while_the_app_runs_are_answered_then_closed
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1, **LONG_WAITS) do |server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      client.write(get("/second"))
      client.socket.close_write
      sleep 0.05 # both in the socket before the thread hands the connection back
      release << :go
      assert_match(%r{\A/block1 on }, client.read_response.body)
      assert_match(%r{\A/second on }, client.read_response.body)
      assert_equal :eof, client.wait_close(timeout: 2)
      s = core_stats_until(server, timeout: 2) { |st| st[:connections].zero? }
      assert_equal 0, s[:connections]
      client.close
    end
  end

  # Half a head and the FIN while the app runs: closed once the response is out.
  def test_half_a_head_and_a_close_while_the_app_runs_close_after_the_response
    started = Queue.new
    release = Queue.new
    with_server(gate_app(started, release), min_threads: 1, max_threads: 1, **LONG_WAITS) do |server, port|
      client = connect(port).write(get("/block1"))
      assert_equal "/block1", started.pop
      client.write("GET /sec")
      client.socket.close_write
      sleep 0.05
      release << :go
      assert_match(%r{\A/block1 on }, client.read_response.body)
      assert_equal :eof, client.wait_close(timeout: 2)
      s = core_stats_until(server, timeout: 2) { |st| st[:connections].zero? }
      assert_equal 0, s[:connections]
      client.close
    end
  end
end
