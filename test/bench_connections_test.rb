# frozen_string_literal: true

# The connections workload's parts that need no timing: which servers each
# workload runs (iodine and nginx are opt-in, nginx runs no Rack app) and the
# idle-connection client (opens, reads one answer each, keeps them open,
# notices the ones the server closed).
require_relative "test_helper"
require "socket"
require_relative "../bench/lib/bench"

class BenchConnectionsTest < Minitest::Test
  FakeServer = Struct.new(:name, :rack, :opt_in) do
    def rack? = rack
    def opt_in? = opt_in
  end

  SERVERS = [FakeServer.new("serval", true, false), FakeServer.new("puma", true, false),
             FakeServer.new("unicorn", true, false), FakeServer.new("iodine", true, true),
             FakeServer.new("nginx", false, true)].freeze

  def setup
    @ctx = Bench::Context.new(File.expand_path("../bench", __dir__), io: StringIO.new)
  end

  def teardown
    @ctx.cleanup
  end

  def names(workload, explicit: false)
    Bench::Workload.registry.fetch(workload).new(@ctx).eligible(SERVERS, explicit: explicit).map(&:name)
  end

  # The timing check pairs serval and serval-notiming round by round: here
  # the load moved between rounds, so the two medians come from different
  # rounds (8.1 against 10.0 us: 0.81), while each round's pair shows 1-2 %.
  def test_the_timing_check_uses_the_rounds_pairs
    w = Bench::Workload.registry.fetch("connections").new(@ctx)
    rounds = ->(cpus) { cpus.map { |u| { "levels" => { "16" => { "cpu_us_per_request" => u } } } } }
    results = {
      "serval" => { "rounds" => rounds.([8.0, 8.1, 10.0, 10.1, 10.2]), "levels" => { "16" => { "cpu_us_per_request" => 10.0 } } },
      "serval-notiming" => { "rounds" => rounds.([7.9, 8.0, 8.1, 9.9, 10.0]), "levels" => { "16" => { "cpu_us_per_request" => 8.1 } } }
    }
    assert_in_delta 0.81, w.send(:cpu_ratio, results, 16, "serval-notiming"), 1e-9
    assert_in_delta 0.98, w.send(:paired_cpu_ratio, results, 16, "serval-notiming"), 1e-9
    results["serval-notiming"]["rounds"][4] = { "levels" => {} } # a round without the level: left out
    assert_in_delta 0.984, w.send(:paired_cpu_ratio, results, 16, "serval-notiming"), 1e-3
    assert_nil w.send(:paired_cpu_ratio, results, 1000, "serval-notiming")
  end

  def test_opt_in_servers_run_only_where_named_and_nginx_only_as_a_limit_line
    assert_equal %w[serval puma unicorn], names("hello")
    assert_equal %w[serval puma unicorn iodine], names("hello", explicit: true)
    conns = Bench::Workload.registry.fetch("connections").new(@ctx)
    assert_equal %w[serval puma iodine nginx], conns.select(conns.eligible(SERVERS)).map(&:name)
    assert_equal %w[serval puma nginx], conns.select(conns.eligible(SERVERS.reject { |s| s.name == "iodine" })).map(&:name)
  end

  def test_real_adapters_declare_what_they_are
    nginx = Bench::Server.registry.fetch("nginx").new(@ctx)
    refute nginx.rack?
    assert nginx.opt_in?
    assert Bench::Server.registry.fetch("iodine").new(@ctx).opt_in?
    refute Bench::Server.registry.fetch("puma").new(@ctx).opt_in?
    argv = Bench::Server.registry.fetch("serval").new(@ctx).argv(app: "x.ru", port: 1, threads: 4, max_connections: 11_024)
    assert_equal "11024", argv[argv.index("--max-connections") + 1]
  end

  # A keep-alive server: one answer per connection, then the connection stays
  # open, except the one at index `close_at`, which it closes after answering.
  def start_server(count, close_at)
    server = TCPServer.new("127.0.0.1", 0)
    closed = Queue.new
    held = []
    thread = Thread.new do
      count.times do |i|
        sock = server.accept
        head = +""
        head << sock.readpartial(4096) until head.include?("\r\n\r\n")
        sock.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if i == close_at
          sock.close
          closed << i
        else
          held << sock
        end
      end
    end
    [server, thread, closed, held]
  end

  def test_idle_clients_keep_answered_connections_open_and_see_closed_ones
    server, thread, closed, held = start_server(20, 7)
    clients = Bench::IdleClients.new("127.0.0.1", server.addr[1], batch: 6, timeout: 5)
    assert_equal 20, clients.open(20)
    assert_empty clients.failures
    assert_equal 7, closed.pop
    assert thread.join(5)
    deadline = Bench::Util.now + 5
    open = clients.still_open until open == 19 || Bench::Util.now > deadline
    assert_equal 19, open
  ensure
    clients&.close
    held&.each(&:close)
    server&.close
  end

  def test_idle_clients_count_an_error_status_as_a_failure
    server = TCPServer.new("127.0.0.1", 0)
    thread = Thread.new do
      sock = server.accept
      sock.readpartial(4096)
      sock.write("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n")
      sock
    end
    clients = Bench::IdleClients.new("127.0.0.1", server.addr[1], batch: 1, timeout: 5)
    assert_equal 0, clients.open(1)
    assert_equal({ "status 503" => 1 }, clients.failures)
  ensure
    thread&.value&.close
    server&.close
  end
end
