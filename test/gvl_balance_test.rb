# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require "support/subprocess_server"

# GVL-aware balancing across workers (docs/tuning.md "Balancing workers"):
# the native switches (Core#balance_hold=, Core#balance_move) on one server,
# then a real cluster whose GVL-bound worker moves a keep-alive client to
# its idle sibling.
class GVLBalanceTest < Minitest::Test
  include Serval::SubprocessHelpers

  Client = Serval::HttpWire::Client
  GET = "GET / HTTP/1.1\r\nhost: x\r\n\r\n"
  HELLO = ->(_env) { [200, { "content-type" => "text/plain", "content-length" => "5" }, ["hello"]] }

  def test_a_granted_move_ends_one_keep_alive_connection_after_a_complete_response
    with_server(HELLO, balance: true, min_threads: 2, max_threads: 2) do |server, port|
      c = Client.new(port)
      r = c.write(GET).read_response
      assert_nil r.field("connection")
      server.core.balance_move
      r = c.write(GET).read_response
      assert_equal [200, "close", "hello"], [r.status, r.field("connection"), r.body]
      assert_equal :eof, c.wait_close, "closed once the response was written"
      other = Client.new(port)
      2.times do
        r = other.write(GET).read_response
        assert_nil r.field("connection"), "one grant moves one connection"
      end
      assert_equal 1, server.core.balance_moved
      other.close
    end
  end

  def test_a_move_waits_for_the_response_in_progress_and_spares_non_keep_alive
    gate = Queue.new
    entered = Queue.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/hold"
        entered << true
        gate.pop
      end
      [200, { "content-type" => "text/plain", "content-length" => "5" }, ["hello"]]
    end
    with_server(app, balance: true, min_threads: 2, max_threads: 2) do |server, port|
      c = Client.new(port)
      c.write("GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
      entered.pop
      # the move is granted while a request is in the app: nothing is cut
      server.core.balance_move
      closing = Client.new(port)
      r = closing.write("GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").read_response
      assert_equal "close", r.field("connection")
      assert_equal 0, server.core.balance_moved, "a connection closing anyway does not use the move"
      gate << true
      r = c.read_response
      assert_equal [200, "close", "hello"], [r.status, r.field("connection"), r.body]
      assert_equal :eof, c.wait_close
      assert_equal 1, server.core.balance_moved
    end
  end

  # A drain (a worker stopping or becoming the mold) gives an idle
  # keep-alive connection a moment for its client's next request: the
  # request threads stay for it, and it is answered with connection: close
  # (before, the threads left at once and the request waited unanswered).
  def test_a_drain_answers_the_next_request_of_an_idle_keep_alive_connection
    with_server(HELLO, balance: true, min_threads: 2, max_threads: 2) do |server, port|
      c = Client.new(port, timeout: 3)
      assert_equal 200, c.write(GET).read_response.status
      stopping = Thread.new { server.stop(5) }
      # the threads had left by now without the connection's moment
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.1
      Thread.pass while server.stats[:running] == 2 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      r = c.write(GET).read_response
      assert_equal [200, "close", "hello"], [r.status, r.field("connection"), r.body]
      assert_equal :eof, c.wait_close
      assert stopping.join(5), "the stop ends once the connection is closed"
    end
  end

  def test_hold_keeps_new_connections_waiting_until_released
    with_server(HELLO, balance: true, min_threads: 2, max_threads: 2) do |server, port|
      served = Client.new(port)
      assert_equal 200, served.write(GET).read_response.status
      server.core.balance_hold = true
      assert server.core.balance_hold?
      # a response on an open connection after the switch: the loop has
      # run since, and taken the listener out of epoll
      assert_equal 200, served.write(GET).read_response.status
      waiting = Client.new(port) # the kernel completes the handshake; nobody accepts
      waiting.write(GET)
      assert waiting.silent_for?(0.3), "a holding worker accepted a new connection"
      assert_equal 200, served.write(GET).read_response.status, "open connections are still served"
      server.core.balance_hold = false
      assert_equal 200, waiting.read_response.status
    end
  end

  # 3 keep-alive clients all on worker 0 (4 threads; worker 1 is held in its boot
  # hook while they connect), each request burning 10 ms of CPU: worker 0's
  # GVL is saturated, worker 1 idles once booted. With balancing on, a
  # response says "connection: close" and that client's reconnection is
  # served by worker 1.
  def test_a_gvl_bound_worker_moves_a_keep_alive_client_to_its_idle_sibling
    require "serval/native_ext"
    unless Serval::Native::GVL.supported?
      skip "Ruby < 3.2 measures the GVL by the process's CPU time, which a machine busy with other work " \
           "keeps below saturation; the policy itself is tested in balance_policy_test.rb"
    end
    server, pids = cluster_with_clients_on_worker_zero("")
    results = Queue.new # one item per client: [pid its reconnection reached] or :stayed, or an error
    stop = false
    threads = @clients.each_with_index.map do |client, i|
      Thread.new do
        results << move_once(server, client, i, pids[0]) { stop }
      rescue StandardError, Minitest::Assertion => e
        results << e
      end
    end
    outcomes = []
    outcomes << results.pop until outcomes.any?(Array) || outcomes.size == threads.size
    stop = true
    threads.each(&:join)
    outcomes.each { |o| raise o if o.is_a?(Exception) }
    assert_equal [[pids[1]]], outcomes.grep(Array), "one client moved, to the idle worker: #{outcomes.inspect}"
  end

  def test_with_gvl_balance_off_connections_stay
    _server, pids = cluster_with_clients_on_worker_zero("gvl_balance false\n")
    seen = @clients.map do |client|
      Thread.new { Array.new(100) { client.write(GET).read_response.then { |r| [r.field("connection"), r.body.to_i] } } }
    end.flat_map(&:value)
    assert_equal [[nil, pids[0]]], seen.uniq
  end

  # Thread polls (ext/serval/request.c) are in effect in a cluster worker with
  # gvl_balance on (the default): each worker's check-in says so, and under
  # keep-alive load from eight clients at a time, on new connections each
  # round (accepted while the rounds may be the request threads'; a client
  # told "connection: close" when no thread was free reconnects), request
  # threads ran rounds of the loop while every request was answered.
  def test_workers_poll_with_balancing_on
    require "json"
    hook = Serval::Native::GVL.respond_to?(:supported?) && Serval::Native::GVL.supported?
    files = { "config.ru" => Serval::SubprocessServer::HELLO,
              "c.rb" => "workers 2\nthreads 4, 4\nworker_check_interval 0.2\n" }
    server = spawn_server(["-C", "c.rb", "-b", "tcp://127.0.0.1:0", "--control-url", "unix://ctl.sock",
                           "--control-token", "t"], files: files).boot
    2.times { |i| server.wait_for(/Worker #{i}\b.*booted/) }
    answers = Queue.new
    4.times do
      Array.new(8) do
        Thread.new do
          client = Client.new(server.port)
          50.times do
            r = client.write(GET).read_response
            answers << [r.status, r.body]
            next unless r["connection"] == "close" # no thread free: the client may go to the sibling

            client.close
            client = Client.new(server.port)
          end
          client.close
        end
      end.each(&:join)
    end
    assert_equal [[200, "hello\n"]], Array.new(answers.size) { answers.pop }.uniq
    # the workers check in every 0.2 s: read the master's view until it has every request
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    statuses = nil
    loop do
      statuses = control_stats(server)["worker_status"].map { |w| w["last_status"] }
      break if statuses.sum { |st| st["requests_count"].to_i } >= 4 * 8 * 50 ||
               Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
    assert_equal [hook, hook], statuses.map { |st| st["thread_polls"] }
    skip "no thread event hook: the loop reads every request" unless hook
    assert_operator statuses.sum { |st| st["polled_rounds"].to_i }, :>, 0
  end

  private

  def control_stats(server)
    socket = UNIXSocket.new(File.join(server.dir, "ctl.sock"))
    socket.write("GET /stats?token=t HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    JSON.parse(socket.read.split("\r\n\r\n", 2)[1])
  ensure
    socket&.close
  end

  # Requests on one keep-alive client until a response ends it (then
  # reconnects: [the pid that answers]), or :stayed.
  def move_once(server, client, slot, pid0)
    400.times do
      return :stayed if yield

      r = client.write(GET).read_response
      next unless r.field("connection") == "close"

      assert_equal "200 #{pid0}", "#{r.status} #{r.body}", "the moving response is complete"
      assert_equal :eof, client.wait_close
      client = @clients[slot] = Client.new(server.port)
      return [client.write(GET).read_response.body.to_i]
    end
    :stayed
  end

  BURN_APP = <<~RUBY
    run lambda { |env|
      stop = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.01
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < stop
      body = Process.pid.to_s
      [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
    }
  RUBY

  def cluster_with_clients_on_worker_zero(extra)
    # 4 threads for 3 clients: a thread is always free, so balance mode's
    # own close when none is (sv_write_head) never fires; only the balancer moves
    config = "bind 'tcp://127.0.0.1:0'\nworkers 2\nthreads 4, 4\ngvl_balance_interval 0.2\n" \
             "before_worker_boot { |i| File.read('gate') if i == 1 }\n#{extra}"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => BURN_APP, "c.rb" => config })
    gate = File.join(server.dir, "gate")
    File.mkfifo(gate)
    server.boot
    pid0 = server.wait_for(/Worker 0 \(PID: (\d+)\) booted/)[1].to_i
    @clients = Array.new(3) { Client.new(server.port) }
    @clients.each { |c| assert_equal pid0.to_s, c.write(GET).read_response.body }
    File.write(gate, "go") # worker 1 reads it in its boot hook
    pid1 = server.wait_for(/Worker 1 \(PID: (\d+)\) booted/)[1].to_i
    [server, [pid0, pid1]]
  end

  def teardown
    @clients&.each(&:close)
    super
  end
end
