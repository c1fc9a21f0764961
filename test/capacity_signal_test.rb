# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require "support/subprocess_server"

# What load balancers hear (Serval::Capacity): GET /ready on the metrics
# listener and the HAProxy agent-check responder, in each state, against a
# real HAProxy for the agent.
class CapacitySignalTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  # /hold writes to the FIFO "entered", then waits until the test writes to
  # the FIFO "release"; /burn spends 5 ms of CPU; "/" answers at once.
  APP = <<~RUBY
    run lambda { |env|
      if env["PATH_INFO"] == "/hold"
        File.write("entered", "in")
        File.read("release")
      end
      if env["PATH_INFO"] == "/burn"
        stop = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.005
        x = 0
        x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < stop
      end
      [200, { "content-type" => "text/plain", "content-length" => "2" }, ["ok"]]
    }
  RUBY

  def free_port = Serval::SubprocessServer.free_port

  # A cluster of one worker whose boot waits for the FIFO "gate".
  def gated_cluster(extra)
    config = "bind 'tcp://127.0.0.1:0'\nworkers 1\nthreads 2, 2\n" \
             "before_worker_boot { |_i| File.read('gate') }\n#{extra}"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => APP, "c.rb" => config })
    %w[gate release entered].each { |f| File.mkfifo(File.join(server.dir, f)) }
    server.boot
  end

  def ready(port)
    res = http(port, good_request("/ready"))
    [res.status, res.body[/\A\w+/]]
  end

  def open_gate(server, fifo = "gate")
    File.write(File.join(server.dir, fifo), "go")
  end

  # A request that stays in the app until release; returns once it is there.
  def hold_request(server)
    thread = Thread.new { http(server.port, good_request("/hold"), timeout: 15).body }
    File.read(File.join(server.dir, "entered")) # the app writes it once the request is in
    thread
  end

  def test_ready_follows_boot_and_graceful_stop_in_cluster_mode
    metrics = free_port
    server = gated_cluster("metrics_bind 'tcp://127.0.0.1:#{metrics}'\n")
    server.wait_for(/Metrics on/)
    assert_equal [503, "booting"], ready(metrics), "no worker has booted"
    open_gate(server)
    server.wait_for(/Worker 0 \(PID: \d+\) booted/)
    assert_equal [200, "ready"], ready(metrics)
    held = hold_request(server)
    server.signal("TERM")
    server.wait_for(/Gracefully stopping/)
    assert_equal [503, "stopping"], ready(metrics)
    open_gate(server, "release")
    assert_equal "ok", held.value
  end

  def test_ready_in_single_mode
    metrics = free_port
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "--metrics-bind", "tcp://127.0.0.1:#{metrics}", "config.ru"],
                          files: { "config.ru" => APP })
    %w[release entered].each { |f| File.mkfifo(File.join(server.dir, f)) }
    server.boot
    server.wait_for(/Metrics on/)
    assert_equal [200, "ready"], ready(metrics)
    held = hold_request(server)
    server.signal("TERM")
    server.wait_for(/Gracefully stopping/)
    assert_equal [503, "stopping"], ready(metrics)
    open_gate(server, "release")
    assert_equal "ok", held.value
  end

  def test_agent_check_answers_each_state
    agent = free_port
    server = gated_cluster("agent_check_url 'tcp://127.0.0.1:#{agent}'\n")
    server.wait_for(/agent-check on tcp:\/\/127\.0\.0\.1:#{agent}/)
    assert_equal "down #booting\n", agent_line(agent)
    open_gate(server)
    server.wait_for(/Worker 0 \(PID: \d+\) booted/)
    assert_match(/\Aup ready \d+%\n\z/, agent_line(agent))
    held = hold_request(server)
    server.signal("TERM")
    server.wait_for(/Gracefully stopping/)
    assert_equal "down #stopping\n", agent_line(agent)
    open_gate(server, "release")
    held.value
  end

  def test_options_are_validated_and_have_flags
    ["http://127.0.0.1:1", "tcp://127.0.0.1", "tcp://host:99999", ""].each do |url|
      error = assert_raises(Serval::ConfigError) { Serval::Configuration.load(cli: { agent_check_url: url }, config_file: "-") }
      assert_match(/\Aagent_check_url: /, error.message)
    end
    assert_equal "tcp://[::1]:9300", Serval::Configuration.load(cli: { agent_check_url: "tcp://[::1]:9300" }, config_file: "-")[:agent_check_url]
    error = assert_raises(Serval::ConfigError) { Serval::Configuration.load(cli: { gvl_balance_interval: 0.01 }, config_file: "-") }
    assert_match(/\Agvl_balance_interval: must be >= 0.2/, error.message)
    require "serval/cli"
    { %w[--no-gvl-balance --agent-check-url tcp://127.0.0.1:9300] => { gvl_balance: false, agent_check_url: "tcp://127.0.0.1:9300" },
      %w[--gvl-balance] => { gvl_balance: true } }.each do |argv, expected|
      cli = Serval::CLI.new(argv)
      cli.send(:parse)
      assert_equal expected, cli.instance_variable_get(:@cli)
    end
  end

  # HAProxy with `agent-check agent-port N agent-inter 200ms` in front of a
  # cluster: the server is DOWN while Serval boots, UP once a worker serves,
  # its weight drops below 100 % while the worker's GVL is busy and comes
  # back when it idles, and it goes DOWN when Serval stops.
  IDLE_WEIGHT = 95

  def test_haproxy_follows_the_agent
    haproxy_path = (ENV.fetch("PATH", "").split(File::PATH_SEPARATOR) + %w[/usr/sbin /sbin])
                   .map { |d| File.join(d, "haproxy") }.find { |f| File.executable?(f) }
    skip "haproxy is not installed (apt-get install haproxy); .ci/run installs it" unless haproxy_path

    agent = free_port
    server = gated_cluster("agent_check_url 'tcp://127.0.0.1:#{agent}'\n")
    server.wait_for(/agent-check on/)
    haproxy = start_haproxy(haproxy_path, server, agent)
    wait_state(haproxy) { |s| s["srv_op_state"] == "0" && s["srv_agent_state"].to_i.positive? }
    open_gate(server)
    server.wait_for(/Worker 0 \(PID: \d+\) booted/)
    # idle: full weight, give or take the worker's own housekeeping (on Ruby
    # 3.1 the GVL share is the process's CPU time: an idle worker reads ~1 %)
    wait_state(haproxy) { |s| s["srv_op_state"] == "2" && s["srv_uweight"].to_i >= IDLE_WEIGHT }

    load = Serval::HttpWire::LoadClient.new(server.port, threads: 2, path: "/burn").start
    busy = wait_state(haproxy) { |s| s["srv_op_state"] == "2" && s["srv_uweight"].to_i < 50 }
    assert_operator busy["srv_uweight"].to_i, :>=, 1
    result = load.stop
    assert_equal 0, result.failed, result.errors.inspect
    wait_state(haproxy) { |s| s["srv_uweight"].to_i >= IDLE_WEIGHT }

    held = hold_request(server)
    server.signal("TERM")
    wait_state(haproxy) { |s| s["srv_op_state"] == "0" }
    open_gate(server, "release")
    held.value
  end

  private

  def agent_line(port)
    TCPSocket.open("127.0.0.1", port) { |s| s.read }
  end

  def start_haproxy(path, server, agent)
    dir = server.dir
    @haproxy_sock = File.join(dir, "haproxy.sock")
    File.write(File.join(dir, "haproxy.cfg"), <<~CFG)
      global
        stats socket #{@haproxy_sock} mode 600 level admin
      defaults
        mode http
        timeout connect 1s
        timeout client 5s
        timeout server 5s
      frontend fe
        bind 127.0.0.1:#{free_port}
        default_backend be
      backend be
        server s1 127.0.0.1:#{server.port} weight 100 agent-check agent-port #{agent} agent-inter 200ms
    CFG
    log = File.join(dir, "haproxy.log")
    @haproxy = Process.spawn(path, "-db", "-f", File.join(dir, "haproxy.cfg"), out: log, err: log, pgroup: true)
    self
  end

  # Polls HAProxy's `show servers state be` (the stats socket; HAProxy
  # applies an agent answer every agent-inter) until the block accepts the
  # server's row; returns it.
  def wait_state(_haproxy, timeout: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    last = nil
    loop do
      last = server_state
      return last if last && yield(last)
      raise "HAProxy's state never matched; last: #{last.inspect}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  def server_state
    out = UNIXSocket.open(@haproxy_sock) do |s|
      s.write("show servers state be\n")
      s.read
    end
    header = out.lines.find { |l| l.start_with?("# be_id") }
    row = out.lines.find { |l| l.match?(/\A\d+ be /) }
    return nil unless header && row

    header.delete_prefix("# ").split.zip(row.split).to_h
  rescue SystemCallError
    nil
  end

  def teardown
    if @haproxy
      Process.kill("TERM", -@haproxy)
      Process.wait(@haproxy)
    end
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    super
  end
end
