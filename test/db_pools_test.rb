# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require_relative "support/subprocess_server"
require "json"
require "open3"
require "serval/prometheus"
require "serval/db_pools"
require "serval/ctl"

# Active Record's connection pools seen by Serval: pool figures in /stats and
# /metrics, pool_wait per request, the max_threads > pool warning. The real
# servers load Active Record with sqlite3 (the Gemfile's test group); this
# process never does, so the rest of the suite runs without Active Record.
class DbPoolsTest < Minitest::Test
  include Serval::HttpWire
  include Serval::SubprocessHelpers

  TOKEN = "pooltoken"

  # /hold checks out a connection and keeps it until /release?n=N lets N
  # holders go; /timings?n=N answers the env["serval.timing"] of the next N
  # finished /hold requests (blocking until they are there).
  APP = <<~RUBY
    require "active_record"
    require "json"
    ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: ":memory:",
                                            pool: Integer(ENV.fetch("POOL")), checkout_timeout: 30)
    GATE = Queue.new
    TIMINGS = Queue.new
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/hold"
        env["rack.response_finished"] << ->(e, *) { TIMINGS << e["serval.timing"]&.to_h }
        ActiveRecord::Base.connection_pool.with_connection do |c|
          c.select_value("SELECT 1")
          GATE.pop
        end
        [200, { "content-type" => "text/plain" }, ["held\\n"]]
      when "/release"
        Integer(env["QUERY_STRING"][/n=(\\d+)/, 1]).times { GATE << 1 }
        [200, { "content-type" => "text/plain" }, ["released\\n"]]
      when "/patched"
        names = ActiveRecord::ConnectionAdapters::ConnectionPool::Queue.ancestors.map(&:to_s).grep(/Serval/)
        [200, { "content-type" => "text/plain" }, [names.inspect]]
      when "/timings"
        n = Integer(env["QUERY_STRING"][/n=(\\d+)/, 1])
        [200, { "content-type" => "application/json" }, [JSON.generate(Array.new(n) { TIMINGS.pop })]]
      else
        [404, { "content-type" => "text/plain" }, ["no\\n"]]
      end
    end
    run app
  RUBY

  def self.active_record_loads?
    return @active_record_loads unless @active_record_loads.nil?

    env = { "BUNDLE_GEMFILE" => File.join(Serval::SubprocessServer::ROOT, "Gemfile") }
    _, status = Open3.capture2e(env, RbConfig.ruby, "-rbundler/setup", "-e",
                                'require "active_record"; require "sqlite3"')
    @active_record_loads = status.success?
  end

  def need_active_record
    return if self.class.active_record_loads?

    skip "activerecord + sqlite3 do not load here (Gemfile test group); CI installs them"
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def get(port, path)
    http(port, "GET #{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout: 15)
  end

  def control(port, path)
    JSON.parse(get(port, "#{path}#{path.include?('?') ? '&' : '?'}token=#{TOKEN}").body, symbolize_names: true)
  end

  # Polls until the block returns truthy (a server's state, not a clock): 10 ms
  # apart, bounded by the suite's per-test timeout.
  def eventually(_what)
    loop do
      value = yield
      return value if value

      sleep 0.01
    rescue Errno::ECONNREFUSED, EOFError
      sleep 0.01
    end
  end

  def boot(args, pool:, files: {})
    server = spawn_server(args, files: { "config.ru" => APP }.merge(files), env: { "POOL" => pool.to_s })
    server.boot(timeout: 30)
  end

  # The issue's case in miniature: 5 threads over a pool of 2. Two requests
  # hold both connections; two more block in the checkout. While they wait,
  # /stats and /metrics show waiting 2; once released, the blocked ones
  # report the wait as pool_wait (env, access log), not as idle.
  def test_single_mode_pool_figures_pool_wait_and_warning
    need_active_record
    ctl = Serval::SubprocessServer.free_port
    metrics = Serval::SubprocessServer.free_port
    server = boot(["-t", "5:5", "-p", "0", "--log-requests", "--db-pool-wait", "--control-url", "tcp://127.0.0.1:#{ctl}",
                   "--control-token", TOKEN, "--metrics-bind", "tcp://127.0.0.1:#{metrics}", "config.ru"], pool: 2)
    server.wait_for(/Control app on/)
    assert_equal [{ name: "primary", size: 2, connections: 0, busy: 0, idle: 0, waiting: 0, dead: 0 }],
                 control(ctl, "/stats")[:db_pools]
    port = server.port

    holders = Array.new(2) { Thread.new { get(port, "/hold").status } }
    eventually("2 busy") { control(ctl, "/stats")[:db_pools].first[:busy] == 2 }
    waiters = Array.new(2) { Thread.new { get(port, "/hold").status } }
    pools = eventually("2 waiting") do
      p = control(ctl, "/stats")[:db_pools]
      p if p.first[:waiting] == 2
    end
    seen_waiting = now
    assert_equal [{ name: "primary", size: 2, connections: 2, busy: 2, idle: 0, waiting: 2, dead: 0 }], pools
    text = get(metrics, "/metrics").body
    assert_includes text, %(serval_db_pool_waiting{pool="primary"} 2\n)
    assert_includes text, %(serval_db_pool_size{pool="primary"} 2\n)
    assert_includes text, %(serval_db_pool_busy{pool="primary"} 2\n)
    out = StringIO.new
    assert_equal 0, Serval::Ctl.new(["--control-url", "tcp://127.0.0.1:#{ctl}", "--control-token", TOKEN, "stats"],
                                    stdout: out, stderr: out).run
    assert_equal 2, JSON.parse(out.string)["db_pools"].first["waiting"], out.string
    released = now
    assert_equal 200, get(port, "/release?n=4").status
    assert_equal [200] * 4, (holders + waiters).map(&:value)

    timings = JSON.parse(get(port, "/timings?n=4").body, symbolize_names: true)
    blocked, free = timings.partition { |t| t[:pool_wait].positive? }
    assert_equal 2, blocked.size, timings.inspect
    free.each { |t| assert_equal 0.0, t[:pool_wait], t.inspect }
    blocked.each do |t|
      # The test saw them waiting at seen_waiting and let them go after released.
      assert_operator t[:pool_wait], :>=, released - seen_waiting, t.inspect
      assert_operator t[:pool_wait], :<=, t[:wall], t.inspect
      assert_split_adds_up(t)
    end
    log = eventually("4 access lines") do
      lines = server.stdout.lines.grep(%r{"GET /hold })
      lines if lines.size == 4
    end
    waits = log.map { |l| Float(l[/ pool_wait=(\d+\.\d\d)$/, 1] || flunk("no pool_wait in #{l}")) }
    assert_equal 2, waits.count(&:positive?), log.join
    # the rolling window keeps each request's pool_wait with its other figures; the counter sums them
    waited = control(ctl, "/window")[:samples].select { |x| x[:pool_wait].positive? }
    assert_equal 2, waited.size, "the window's samples"
    waited.each { |x| assert_operator x[:pool_wait], :>=, released - seen_waiting, x.inspect }
    total = Float(get(metrics, "/metrics").body[/^serval_request_pool_wait_seconds_total (\S+)$/, 1] || flunk("no counter"))
    assert_operator total, :>=, 2 * (released - seen_waiting)
    assert_equal 0, control(ctl, "/stats")[:db_pools].first[:waiting]
    warning = server.wait_for(/^WARNING: max_threads.*/, stream: :err)[0]
    assert_match(/\AWARNING: max_threads 5 \([^)]+\) .*"primary": 2 \(database config "primary" pool\)/, warning)
  end

  # run + idle + stall + pool_wait = wall with the GVL hook; without it
  # (Ruby 3.1) the wait is outside `wait`.
  def assert_split_adds_up(timing)
    if timing[:run]
      sum = timing[:run] + timing[:idle] + timing[:stall] + timing[:pool_wait]
      assert_in_delta timing[:wall], sum, [0.002, timing[:wall] * 0.02].max, timing.inspect
      assert_operator timing[:idle], :<, timing[:wall] - timing[:pool_wait] + 0.002, timing.inspect
    else
      assert_operator timing[:wait], :<=, timing[:wall] - timing[:pool_wait] + 1e-6, timing.inspect
    end
  end

  # Cluster mode: the worker warns (its own pid), and its pool figures and
  # pool_wait histogram reach the master's /metrics labelled by worker.
  def test_cluster_worker_pool_metrics_and_warning
    need_active_record
    metrics = Serval::SubprocessServer.free_port
    config = "worker_check_interval 0.1\ndb_pool_wait true\n"
    server = boot(["-w", "1", "-t", "3:3", "-p", "0", "-C", "serval_conf.rb", "--metrics-bind",
                   "tcp://127.0.0.1:#{metrics}", "config.ru"], pool: 1, files: { "serval_conf.rb" => config })
    warning = server.wait_for(/^WARNING: max_threads.*/, stream: :err)[0]
    assert_match(/\AWARNING: max_threads 3 \([^)]+\) in pid (\d+), .*"primary": 1 \(database config "primary" pool\)/,
                 warning)
    refute_equal server.pid, Integer(warning[/pid (\d+)/, 1]), "the worker warns, not the master"

    holder = Thread.new { get(server.port, "/hold").status }
    text = eventually("busy 1") do
      t = get(metrics, "/metrics").body
      t if t.match?(/^serval_db_pool_busy\{worker="0",pid="\d+",pool="primary"\} 1$/)
    end
    assert_match(/^serval_db_pool_size\{worker="0",pid="\d+",pool="primary"\} 1$/, text)
    waiter = Thread.new { get(server.port, "/hold").status }
    eventually("waiting 1") { get(metrics, "/metrics").body.match?(/^serval_db_pool_waiting\{[^}]*\} 1$/) }
    assert_equal 200, get(server.port, "/release?n=2").status
    assert_equal [200, 200], [holder.value, waiter.value]
    # every request counts (the two /hold and the /release), as queue_seconds does
    text = eventually("3 requests in the histogram") do
      t = get(metrics, "/metrics").body
      t if t.match?(/^serval_request_pool_wait_seconds_count\{worker="0",pid="\d+"\} 3$/)
    end
    sum = Float(text[/^serval_request_pool_wait_seconds_sum\{worker="0",pid="\d+"\} (\S+)$/, 1])
    assert_operator sum, :>, 0
    check_with_promtool(text)
  end

  def test_prometheus_families_per_pool_and_worker
    pools = [{ name: "primary", size: 5, connections: 3, busy: 2, idle: 1, waiting: 4, dead: 0 },
             { name: "animals role=reading", size: nil, connections: 0, busy: 0, idle: 0, waiting: 0, dead: 0 }]
    text = Serval::Prometheus.render({ backlog: 0, db_pools: pools }, process: {})
    assert_includes text, "# TYPE serval_db_pool_waiting gauge\n"
    assert_includes text, %(serval_db_pool_waiting{pool="primary"} 4\n)
    assert_includes text, %(serval_db_pool_busy{pool="primary"} 2\n)
    assert_includes text, %(serval_db_pool_dead{pool="animals role=reading"} 0\n)
    refute_includes text, %(serval_db_pool_size{pool="animals role=reading"}), "no limit: no size sample"
    worker = { index: 1, pid: 77, booted: true, last_status: { db_pools: JSON.parse(JSON.generate(pools), symbolize_names: true) } } # as WorkerHandle parses check-ins
    text = Serval::Prometheus.render({ workers: 1, worker_status: [worker] }, process: {})
    assert_includes text, %(serval_db_pool_idle{worker="1",pid="77",pool="primary"} 1\n)
    check_with_promtool(text)
  end

  # db_pool_wait is off by default: the pools' figures are there, Active
  # Record is not patched and no request reports pool_wait, even one that
  # waited for a connection.
  def test_pool_wait_is_not_measured_by_default
    need_active_record
    ctl = Serval::SubprocessServer.free_port
    server = boot(["-t", "3:3", "-p", "0", "--log-requests", "--control-url", "tcp://127.0.0.1:#{ctl}",
                   "--control-token", TOKEN, "config.ru"], pool: 1)
    port = server.port
    holder = Thread.new { get(port, "/hold").status }
    eventually("1 busy") { control(ctl, "/stats")[:db_pools].first[:busy] == 1 }
    waiter = Thread.new { get(port, "/hold").status }
    eventually("1 waiting") { control(ctl, "/stats")[:db_pools].first[:waiting] == 1 }
    waiting_since = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal "[]", get(port, "/patched").body, "Active Record's pool queue was patched"
    released = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal 200, get(port, "/release?n=2").status
    assert_equal [200, 200], [holder.value, waiter.value]
    timings = JSON.parse(get(port, "/timings?n=2").body, symbolize_names: true)
    timings.each { |t| assert_nil t[:pool_wait], t.inspect }
    # it was waiting from before waiting_since until the release: its wall
    # holds at least that (the pool's wait, not measured apart, is in it)
    assert_operator timings.map { |t| t[:wall] }.max, :>=, released - waiting_since,
                    "one request waited for the other's connection"
    refute control(ctl, "/stats")[:timing].key?(:request_pool_wait_seconds)
    log = eventually("2 access lines") do
      lines = server.stdout.lines.grep(%r{"GET /hold })
      lines if lines.size == 2
    end
    log.each { |line| refute_match(/pool_wait=/, line) }
  end

  # The private method db_pool_wait wraps: if Active Record changes it, this
  # fails (and DbPools warns and leaves it alone rather than patching
  # something else). The Gemfile's Active Record; the Rails leg runs 8.1's.
  def test_the_wrapped_private_method_is_still_there
    need_active_record
    script = <<~'RUBY'
      require "active_record"
      require "serval/db_pools"
      queue = ActiveRecord::ConnectionAdapters::ConnectionPool::Queue
      problem = Serval::DbPools.send(:wait_poll_problem, queue)
      abort "Active Record #{ActiveRecord.version}: #{problem}" if problem
      abort "wait_poll is public now" if queue.public_method_defined?(:wait_poll)
      # what it does: blocks until an element is added, counted in num_waiting
      q = queue.new
      waiter = Thread.new { q.send(:synchronize) { q.send(:wait_poll, 5) } }
      sleep 0.001 until q.num_waiting == 1
      q.add(:conn)
      abort "wait_poll returned #{waiter.value.inspect}" unless waiter.value == :conn
      other = Class.new(queue) { def wait_poll(timeout, extra) = super(timeout) }
      abort "a changed signature passed" unless Serval::DbPools.send(:wait_poll_problem, other)
      puts ActiveRecord.version
    RUBY
    out, status = Open3.capture2e({ "BUNDLE_GEMFILE" => File.join(Serval::SubprocessServer::ROOT, "Gemfile") },
                                  RbConfig.ruby, "-rbundler/setup", "-I", File.join(Serval::SubprocessServer::ROOT, "lib"),
                                  "-e", script)
    assert status.success?, out
  end

  # Without Active Record (this process) nothing appears: no key, not zeros.
  def test_without_active_record_the_figures_are_absent
    refute defined?(::ActiveRecord), "this test process must not load Active Record"
    seen = Queue.new
    app = lambda do |env|
      env["rack.response_finished"] << ->(e, *) { seen << e["serval.timing"] }
      [200, {}, ["ok"]]
    end
    with_server(app, timing_sample_rate: 1.0) do |server, port|
      assert_equal false, server.watch_db_pools
      get(port, "/")
      assert_nil seen.pop.pool_wait
      stats = server.stats
      refute stats.key?(:db_pools)
      refute stats[:timing].key?("request_pool_wait_seconds")
      text = Serval::Prometheus.render(stats, process: {})
      refute_includes text, "db_pool"
      refute_includes text, "pool_wait"
    end
  end

  # Every thread that takes connections counts: request threads, Action
  # Cable's workers (a stand-in: actioncable is not in the Gemfile),
  # load_async's global executor. Two pools too small, two workers: one line
  # per worker naming both pools and every taker, not one per pool.
  TAKERS_APP = <<~RUBY
    require "active_record"
    module ActionCable
      module Server
        class Base; end
      end
      CONFIG = Struct.new(:worker_pool_size).new(4)
      def self.server = Struct.new(:config).new(CONFIG)
    end
    ActiveRecord.async_query_executor = :global_thread_pool
    ActiveRecord.global_executor_concurrency = 2
    ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: ":memory:", pool: 6)
    class AnimalsRecord < ActiveRecord::Base
      self.abstract_class = true
    end
    AnimalsRecord.establish_connection(adapter: "sqlite3", database: ":memory:", pool: 8)
    class BigRecord < ActiveRecord::Base
      self.abstract_class = true
    end
    BigRecord.establish_connection(adapter: "sqlite3", database: ":memory:", pool: 9)
    run ->(_env) { [200, { "content-type" => "text/plain" }, ["ok\n"]] }
  RUBY

  def test_one_warning_per_process_names_every_taker
    need_active_record
    metrics = Serval::SubprocessServer.free_port
    server = boot(["-w", "2", "-t", "3:3", "-p", "0", "-C", "serval_conf.rb", "--metrics-bind",
                   "tcp://127.0.0.1:#{metrics}", "config.ru"], pool: 1,
                  files: { "config.ru" => TAKERS_APP, "serval_conf.rb" => "worker_check_interval 0.1\n" })
    lines = server.wait_for_count(/^WARNING: max_threads.*/, 2, stream: :err).map { |m| m[0] }
    pids = lines.map { |l| Integer(l[/in pid (\d+)/, 1]) }
    assert_equal 2, pids.uniq.size, lines.join("\n")
    lines.each do |l|
      assert_match(/\AWARNING: max_threads 3 \([^)]+\) \+ 4 Action Cable workers \(config\.action_cable\.worker_pool_size\) \+ 2 load_async threads \(config\.active_record\.global_executor_concurrency\) = 9 threads take database connections in pid \d+, above the size of database pools "primary \(ActiveRecord::Base\)": 6 \(database config "primary" pool\), "primary \(AnimalsRecord\)": 8 \(database config "primary" pool\)\. .*raise the pool to 9 /, l)
    end
    # the workers' check-ins read the pools again (10 per second): no more lines
    5.times { |i| eventually("requests served #{i}") { get(server.port, "/").status == 200 } }
    text = eventually("both workers checked in") do
      t = get(metrics, "/metrics").body
      t if t.scan(/^serval_db_pool_size\{/).size == 6
    end
    # the stats (and the window the advice reads) carry the other takers per pool
    assert_match(/^serval_db_pool_other_threads\{worker="0",pid="\d+",pool="primary \(ActiveRecord::Base\)"\} 6$/, text)
    assert_equal 2, server.stderr.scan(/^WARNING: max_threads/).size, server.stderr
  end

  Config = Struct.new(:name, :configuration_hash)
  Pool = Struct.new(:db_config, :role, :shard, :size)

  def test_pool_size_source_and_names
    primary = Config.new("primary", { adapter: "sqlite3", max_connections: 3 })
    assert_equal 'database config "primary" max_connections', Serval::DbPools.size_source(Pool.new(primary))
    legacy = Config.new("primary", { adapter: "sqlite3", pool: 3 })
    assert_equal 'database config "primary" pool', Serval::DbPools.size_source(Pool.new(legacy))
    bare = Config.new("animals", { adapter: "sqlite3" })
    assert_equal "Active Record default", Serval::DbPools.size_source(Pool.new(bare))
  end

  def promtool
    path = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "promtool") }
    path.find { |f| File.executable?(f) } or skip("promtool not installed (Debian: apt-get install prometheus)")
  end

  def check_with_promtool(text)
    out, status = Open3.capture2e(promtool, "check", "metrics", stdin_data: text)
    assert status.success?, "promtool check metrics failed:\n#{out}\n--- input:\n#{text}"
    assert_empty out.strip, "promtool lint findings:\n#{out}"
  end
end
