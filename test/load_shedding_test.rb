# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "tmpdir"
require "support/watched_io"
require "support/subprocess_server"
require "support/http_wire"
require "serval/prometheus"

# Load shedding (max_queue_time, docs/tuning.md "Load shedding"): a request
# that would wait too long for a thread is answered 503 by the event loop.
# Every scenario holds the only thread with a Queue, so the answers that
# arrive meanwhile can only come from the native core. (The decision's
# arithmetic, fed simulated timings, is tested in test/c/test_shed.c.)
class LoadSheddingTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  TOKEN = "shed-token"

  # GET /hold parks its thread until release gets a value; the rest answer at once.
  def holding_app
    entered = Queue.new
    release = Queue.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/hold"
        entered << true
        release.pop
      end
      [200, { "content-type" => "text/plain" }, ["ok\n"]]
    end
    [app, entered, release]
  end

  def send_get(port, path)
    connect(port).write("GET #{path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
  end

  # Everything the server sends until it closes (connection: close).
  def read_all(client, timeout: 10)
    client.read_all(timeout: timeout)
  ensure
    client.close
  end

  # With the only thread held: sends GET / on new connections, each given
  # `wait` seconds to be answered, until one is. Returns [the answer or nil,
  # the connections still waiting]. A request that waits has been queued; the
  # next one finds the queue standing still for at least `wait` seconds.
  def pile_up(port, attempts:, wait:)
    pending = []
    attempts.times do
      sock = send_get(port, "/")
      return [read_all(sock), pending] unless sock.silent_for?(wait)

      pending << sock
    end
    [nil, pending]
  end

  def hold(port, entered)
    held = Thread.new { read_all(send_get(port, "/hold"), timeout: 15) }
    entered.pop
    held
  end

  def test_requests_that_would_wait_past_the_budget_get_503_from_the_core
    app, entered, release = holding_app
    log = Serval::WatchedIO.new
    log_writer = Serval::LogWriter.new(stdout: StringIO.new, stderr: log)
    with_server(app, min_threads: 1, max_threads: 1, max_queue_time: 0.01, log_writer: log_writer) do |server, port|
      held = hold(port, entered)
      answer, pending = pile_up(port, attempts: 10, wait: 0.5)
      refute_nil answer, "no request was shed while the only thread was held"
      head, body = answer.split("\r\n\r\n", 2)
      assert_match(%r{\AHTTP/1\.1 503 Service Unavailable\r\n}, head)
      assert_match(/^retry-after: 1\r?$/, head)
      assert_match(/^connection: close\r?$/, head)
      assert_equal "queue wait over max_queue_time\n", body
      refute_empty pending, "the first request behind the held one waits for it"
      assert held.alive?, "the held request is still running: a Ruby thread did not answer the 503"

      stats = server.stats
      assert_equal 1, stats[:requests_shed]
      assert_operator stats[:rejected], :>=, 1
      assert_kind_of Float, stats[:queue_wait_estimate]
      assert_operator stats[:queue_wait_estimate], :>, 0.01, "the queue has stood still longer than the budget"
      assert_match(/^serval_requests_shed_total 1$/, Serval::Prometheus.render(server.stats, process: {}))
      log.wait_for(/serval: error response 503 Service Unavailable peer=127\.0\.0\.1 reason="queue wait over max_queue_time"/)

      # nothing handed to the app is dropped: the held request and the queued ones finish
      release << true
      assert_match(%r{\AHTTP/1\.1 200 }, held.value)
      pending.each { |sock| assert_match(%r{\AHTTP/1\.1 200 .*ok\n\z}m, read_all(sock)) }
      assert_equal 1, server.stats[:requests_shed]
      assert_equal 1 + pending.size, server.stats[:requests_count]
    end
  end

  # With thread polls in effect (Ruby 3.3: the request thread reads the
  # requests between requests while the loop parks, ext/serval/request.c):
  # sixteen keep-alive clients keep a single thread busy with requests of a
  # millisecond of CPU, so the queue's predicted wait passes a 2 ms budget.
  # The decisions are taken in the thread's own rounds too; every request is
  # answered, 200 or the core's 503, and the counts add up.
  def test_sheds_while_request_threads_poll
    hook = Serval::Native::GVL.respond_to?(:supported?) && Serval::Native::GVL.supported?
    burn = lambda do |_env|
      stop = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.001
      nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < stop
      [200, { "content-type" => "text/plain" }, ["ok\n"]]
    end
    client_class = Serval::HttpWire::Client
    with_server(burn, min_threads: 1, max_threads: 1, max_queue_time: 0.002) do |server, port|
      answers = Queue.new
      Array.new(16) do
        Thread.new do
          client = client_class.new(port)
          40.times do
            r = client.write("GET / HTTP/1.1\r\nhost: x\r\n\r\n").read_response
            answers << [r.status, r.status == 503 ? r["retry-after"] : r.body]
            next unless r["connection"] == "close"

            client.close
            client = client_class.new(port)
          end
          client.close
        end
      end.each(&:join)
      seen = Array.new(answers.size) { answers.pop }
      assert_equal 16 * 40, seen.size
      assert_empty seen.uniq - [[200, "ok\n"], [503, "1"]]
      stats = server.stats
      assert_equal hook, stats[:thread_polls]
      assert_equal seen.count { |st, _| st == 503 }, stats[:requests_shed]
      assert_operator stats[:requests_shed], :>, 0, "sixteen requests of 1 ms queued for one thread: some wait past 2 ms"
      assert_equal seen.count { |st, _| st == 200 }, stats[:requests_count]
      assert_operator stats[:polled_rounds], :>, 0 if hook
    end
  end

  def test_off_by_default_requests_wait
    app, entered, release = holding_app
    assert_equal 0, Serval::Configuration::DEFAULTS[:max_queue_time]
    with_server(app, min_threads: 1, max_threads: 1) do |server, port|
      held = hold(port, entered)
      answer, pending = pile_up(port, attempts: 3, wait: 0.3)
      assert_nil answer, "a request was answered while the only thread was held"
      release << true
      assert_match(%r{\AHTTP/1\.1 200 }, held.value)
      pending.each { |sock| assert_match(%r{\AHTTP/1\.1 200 }, read_all(sock)) }
      assert_equal 0, server.stats[:requests_shed]
      refute server.stats.key?(:queue_wait_estimate)
    end
  end

  # The launcher as `serval` runs it: while the app's thread is held and
  # requests are shed, the control app answers /stats and the metrics
  # listener /metrics, both counting the shed request.
  def test_control_and_metrics_answer_while_shedding
    require "serval/launcher"
    require "rack/lint"
    app, entered, release = holding_app
    Dir.mktmpdir do |dir|
      options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
        binds: ["tcp://127.0.0.1:0"], min_threads: 1, max_threads: 1, max_queue_time: 0.01,
        control_url: "unix://#{dir}/ctl.sock", control_auth_token: TOKEN, metrics_bind: "unix://#{dir}/metrics.sock"
      ))
      out = Serval::WatchedIO.new
      launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: out, stderr: StringIO.new),
                                               app: Rack::Lint.new(app), signals: false)
      thread = Thread.new { launcher.run }
      assert launcher.wait_until_booted(10), out.string
      out.wait_for("* Control app on")
      port = launcher.urls.first[/:(\d+)\z/, 1].to_i
      held = hold(port, entered)
      answer, pending = pile_up(port, attempts: 10, wait: 0.5)
      assert_match(%r{\AHTTP/1\.1 503 }, answer.to_s)

      stats = unix_get("/stats?token=#{TOKEN}", "#{dir}/ctl.sock")
      assert_match(%r{\AHTTP/1\.1 200 }, stats)
      json = JSON.parse(stats.split("\r\n\r\n", 2).last)
      assert_equal 1, json["requests_shed"]
      assert_kind_of Float, json["queue_wait_estimate"]
      metrics = unix_get("/metrics", "#{dir}/metrics.sock")
      assert_match(/^serval_requests_shed_total 1$/, metrics)
      assert_match(/^serval_queue_wait_estimate_seconds \d/, metrics)

      release << true
      assert_match(%r{\AHTTP/1\.1 200 }, held.value)
      pending.each { |sock| assert_match(%r{\AHTTP/1\.1 200 }, read_all(sock)) }
      launcher.stop
      assert_equal 0, thread.join(10)&.value
    end
  end

  # A launcher's stats that block the control (or metrics) server's only
  # thread until released: requests behind it queue in that small server.
  class BlockingLauncher
    attr_reader :entered, :gate
    attr_accessor :blocking

    def initialize
      @entered = Queue.new
      @gate = Queue.new
      @blocking = false
    end

    def stats
      if blocking
        entered << true
        gate.pop
      end
      { requests_shed: 0 }
    end

    def enqueue(_command) = false
  end

  # The control and metrics listeners are Servers of their own, built from
  # the defaults: max_queue_time of the app's options never reaches them, so
  # a busy control thread makes requests wait, never answers 503. The control
  # app has Control::CONTROL_THREADS threads (one may wait for /advice's
  # model): all of them are kept busy.
  def test_control_and_metrics_listeners_are_exempt
    require "serval/control"
    Dir.mktmpdir do |dir|
      options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
        max_queue_time: 0.01, control_url: "unix://#{dir}/ctl.sock", control_auth_token: TOKEN,
        metrics_bind: "unix://#{dir}/metrics.sock"
      ))
      launcher = BlockingLauncher.new
      control = Serval::Control.start(launcher, options, Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new))
      begin
        { "ctl.sock" => ["/stats?token=#{TOKEN}", Serval::Control::CONTROL_THREADS],
          "metrics.sock" => ["/metrics", 1] }.each do |sock, (path, threads)|
          launcher.blocking = true
          firsts = Array.new(threads) { unix_send("#{dir}/#{sock}", path).tap { launcher.entered.pop } }
          launcher.blocking = false
          behind = Array.new(3) { unix_send("#{dir}/#{sock}", path).tap { |s| assert s.silent_for?(0.3), "#{sock}: answered while its threads were busy" } }
          threads.times { launcher.gate << true }
          [*firsts, *behind].each { |s| assert_match(%r{\AHTTP/1\.1 200 }, read_all(s), sock) }
        end
      ensure
        Serval::Control::CONTROL_THREADS.times { launcher.gate << true }
        control.stop
      end
    end
  end

  def test_bad_values_fail_at_boot_naming_the_option
    { -1 => /\Amax_queue_time: must be >= 0(\.0)? \(got -1(\.0)?\)/, 61 => /\Amax_queue_time: must be <= 60/,
      "soon" => /\Amax_queue_time: expected a number of seconds/ }.each do |value, message|
      error = assert_raises(Serval::ConfigError) { Serval::Configuration.load(cli: { max_queue_time: value }, config_file: "-") }
      assert_match(message, error.message)
    end
    require "serval/cli"
    err = StringIO.new
    assert_equal 1, Serval::CLI.new(["--max-queue-time", "-0.5", "-C", "-"], stdout: StringIO.new, stderr: err).run
    assert_equal "serval: max_queue_time: must be >= 0.0 (got -0.5)\n", err.string
  end

  def test_the_config_file_sets_it
    Dir.mktmpdir do |dir|
      File.write("#{dir}/serval.rb", "max_queue_time 0.05\n")
      options = Serval::Configuration.load(config_file: "#{dir}/serval.rb")
      assert_equal 0.05, options[:max_queue_time]
      assert_equal "config file #{dir}/serval.rb", options[:sources][:max_queue_time]
    end
  end

  # As a user runs it: `serval --max-queue-time 0.01 -t 1:1`, the app's only
  # thread parked on a FIFO the test opens to release it.
  def test_the_flag_sheds_in_a_real_serval
    app = <<~RUBY
      run lambda { |env|
        if env["PATH_INFO"] == "/hold"
          $stdout.puts "entered /hold"
          File.read("release.fifo")
        end
        [200, { "content-type" => "text/plain" }, ["ok\\n"]]
      }
    RUBY
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:1", "--max-queue-time", "0.01"],
                          files: { "config.ru" => app })
    File.mkfifo(File.join(server.dir, "release.fifo"))
    server.boot
    held = Thread.new { read_all(send_get(server.port, "/hold"), timeout: 15) }
    server.wait_for(/entered \/hold/)
    answer, pending = pile_up(server.port, attempts: 10, wait: 0.5)
    assert_match(%r{\AHTTP/1\.1 503 Service Unavailable\r\n.*retry-after: 1\r\n}m, answer.to_s)
    File.write(File.join(server.dir, "release.fifo"), "go")
    assert_match(%r{\AHTTP/1\.1 200 }, held.value)
    pending.each { |sock| assert_match(%r{\AHTTP/1\.1 200 }, read_all(sock)) }
    assert_equal 0, server.stop.exitstatus
    server.wait_for(/error response 503 Service Unavailable .*reason="queue wait over max_queue_time"/, stream: :err)
  end

  def test_per_worker_metrics_in_cluster_mode
    stats = { workers: 2, worker_status: [
      { index: 0, pid: 11, booted: true, last_status: { requests_shed: 4, queue_wait_estimate: 0.03 } },
      { index: 1, pid: 12, booted: true, last_status: { requests_shed: 0, queue_wait_estimate: 0.0 } }
    ] }
    text = Serval::Prometheus.render(stats, process: {})
    assert_match(/^# TYPE serval_requests_shed_total counter$/, text)
    assert_match(/^serval_requests_shed_total\{worker="0",pid="11"\} 4$/, text)
    assert_match(/^serval_requests_shed_total\{worker="1",pid="12"\} 0$/, text)
    assert_match(/^serval_queue_wait_estimate_seconds\{worker="0",pid="11"\} 0\.03$/, text)
  end

  private

  def unix_send(path, request_path)
    connect(UNIXSocket.new(path)).write("GET #{request_path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
  end

  def unix_get(request_path, path)
    read_all(unix_send(path, request_path))
  end
end
