# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require_relative "support/subprocess_server"
require "tmpdir"
require "serval/dsl"
require "serval/idle_timeout"

# Puma 8's DSL methods beyond dsl.rb's own (lib/serval/dsl_puma.rb), and a
# config file calling every Puma 8 method booting under serval.
class PumaDSLTest < Minitest::Test
  include Serval::TestHelpers
  include Serval::HttpWire
  FIXTURE = File.expand_path("fixtures/puma_every_option.rb", __dir__)

  def setup
    @warnings = []
    @dir = Dir.mktmpdir("serval-puma-dsl-")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def load_config(source, cli: {}, env: {})
    file = File.join(@dir, "puma.rb")
    File.write(file, source)
    Serval::Configuration.load(cli: cli, config_file: file, warn: ->(m) { @warnings << m }, env: env)
  end

  def assert_config_error(pattern, source)
    error = assert_raises(Serval::ConfigError) { load_config(source) }
    assert_match pattern, error.message
  end

  def test_keepalive_names_map_to_max_keepalive_requests_and_say_so
    assert_equal 100, load_config("max_keep_alive 100")[:max_keepalive_requests]
    assert_equal ["serval: max_keep_alive 100 -> max_keepalive_requests 100"], @warnings
    assert_equal Serval::Configuration::INT_MAX, load_config("max_keep_alive Float::INFINITY")[:max_keepalive_requests]
    assert_equal 7, load_config("max_keep_alive 7\nmax_fast_inline 3")[:max_keepalive_requests] # Puma's ||=
    assert_equal 3, load_config("max_fast_inline 3")[:max_keepalive_requests]
    assert_equal 1, load_config("enable_keep_alives false")[:max_keepalive_requests]
    assert_equal 1000, load_config("enable_keep_alives true")[:max_keepalive_requests]
    assert_config_error(/max_keep_alive: must be >= 1/, "max_keep_alive 0")
    assert_config_error(/enable_keep_alives: expected true or false/, "enable_keep_alives 'no'")
  end

  def test_mapped_options
    assert_equal 12.0, load_config("force_shutdown_after 12")[:drain_timeout]
    assert_equal 0.0, load_config("force_shutdown_after :immediately")[:drain_timeout]
    assert_equal Serval::Configuration::DAY, load_config("force_shutdown_after")[:drain_timeout]
    refute load_config("wait_for_less_busy_worker 0")[:gvl_balance]
    assert load_config("wait_for_less_busy_worker")[:gvl_balance]
    assert_includes @warnings, "serval: wait_for_less_busy_worker 0 -> gvl_balance false"
    assert_config_error(/force_shutdown_after: expected a number of seconds/, "force_shutdown_after :later")
  end

  def test_each_notice_is_said_once
    load_config("max_keep_alive 5\nmax_keep_alive 5\nio_selector_backend :epoll\nio_selector_backend :epoll")
    assert_equal 2, @warnings.size
  end

  def test_no_effect_options_say_why_and_false_says_nothing
    load_config("prune_bundler false\nextra_runtime_dependencies []\nqueue_requests true\ndrain_on_shutdown false\n" \
                "bind_to_activated_sockets\nsilence_single_worker_warning\nsilence_fork_callback_warning")
    assert_equal [], @warnings
    load_config("prune_bundler\nextra_runtime_dependencies ['puma_worker_killer']\nqueue_requests false\n" \
                "io_selector_backend :auto\nnakayoshi_fork")
    assert_equal %w[prune_bundler extra_runtime_dependencies queue_requests io_selector_backend nakayoshi_fork],
                 @warnings.map { |w| w[/`(\w+)` has no effect in Serval: /, 1] }
  end

  def test_not_yet_options_warn
    options = load_config("fork_worker\ndrain_on_shutdown\nbind_to_activated_sockets 'only'\nworker_culling_strategy :oldest")
    assert options[:activated_sockets_only] # implemented (test/systemd_test.rb), no warning
    assert_equal :oldest, options[:worker_culling_strategy] # implemented (test/signals_test.rb), no warning
    assert_equal 1000, options[:fork_worker] # implemented (test/refork_test.rb), no warning
    assert_equal %w[drain_on_shutdown],
                 @warnings.map { |w| w[/config option `(\w+)` is not supported yet/, 1] }
    assert_config_error(/worker_culling_strategy: expected one of :youngest, :oldest/, "worker_culling_strategy :random")
  end

  def test_implemented_options_are_checked
    o = load_config(<<~RUBY)
      stdout_redirect "out.log", "err.log", true
      state_permission 0o640
      raise_exception_on_sigterm
      supported_http_methods %w[GET POST]
      idle_timeout 30
      clean_thread_locals
      shutdown_debug
      restart_command "bin/serval --foo"
      rack_url_scheme "https"
      tag ""
    RUBY
    assert_equal ["out.log", "err.log", true], o.values_at(:redirect_stdout, :redirect_stderr, :redirect_append)
    assert_equal [0o640, true, %w[GET POST], 30.0, true, true], o.values_at(:state_permission, :raise_exception_on_sigterm,
                                                                        :supported_http_methods, :idle_timeout,
                                                                        :fiber_per_request, :shutdown_debug)
    assert_equal ["bin/serval --foo", "https", nil], o.values_at(:restart_command, :rack_url_scheme, :tag)
    assert_equal :on_force, load_config("shutdown_debug on_force: true")[:shutdown_debug]
    assert_nil load_config("supported_http_methods :any")[:supported_http_methods]
    assert_equal [], @warnings
    assert_config_error(/supported_http_methods: expected :any or a list/, "supported_http_methods %w[GET GET]")
    assert_config_error(/supported_http_methods: expected :any or a list/, "supported_http_methods 'GET'")
    assert_config_error(/state_permission: must be <= 511/, "state_permission 0o1777")
    assert_config_error(/idle_timeout: expected a number of seconds/, "idle_timeout 'never'")
    assert_config_error(/custom_logger: expected an object with #write \(an IO\) or a Logger/, "custom_logger 42")
    assert_config_error(/stdout_redirect: append: expected true or false/, "stdout_redirect 'a', 'b', 'yes'")
    assert_config_error(/log_formatter: give a block/, "log_formatter")
    assert_config_error(/app: give a block/, "app")
  end

  def test_host_inject_get_app
    o = load_config(<<~RUBY)
      set_default_host "127.0.0.2"
      port 4000
      inject { threads 2, 3 }
      max_body get(:max_threads, 0) * 10
      app { |_env| [200, {}, ["hi"]] }
    RUBY
    assert_equal ["tcp://127.0.0.2:4000"], o[:binds]
    assert_equal 30, o[:max_body]
    assert o[:app].respond_to?(:call)
    refute o[:app].frozen?
  end

  def test_single_and_cluster_blocks_follow_the_final_worker_count
    src = "single { threads 1, 1 }\ncluster { threads 2, 2 }\n"
    assert_equal 1, load_config(src)[:max_threads]
    assert_equal 2, load_config("workers 2\n#{src}")[:max_threads]
    assert_equal 2, load_config(src, env: { "WEB_CONCURRENCY" => "3" })[:max_threads]
    assert_equal 1, load_config("workers 2\n#{src}", cli: { workers: 0 })[:max_threads]
    assert_config_error(/puma\.rb:1: cluster: threads: min \(3\) must be <= max \(1\)/, "cluster { threads 3, 1 }\nworkers 2")
  end

  def test_log_writer_formatter_and_custom_logger
    out = StringIO.new
    err = StringIO.new
    logger = StringIO.new
    writer = Serval::LogWriter.new(stdout: out, stderr: err)
    writer.configure(log_formatter: ->(line) { "[x] #{line}" })
    writer.info("one\ntwo")
    writer.error("bad")
    assert_equal "[x] one\n[x] two\n", out.string
    assert_equal "[x] bad\n", err.string
    writer.configure(custom_logger: logger)
    writer.info("three")
    writer.warn("four")
    assert_equal "[x] three\n", logger.string
    assert_equal "[x] bad\n[x] four\n", err.string
    writer.formatter = ->(_line) { raise "boom" }
    writer.error("kept")
    assert_equal "kept\n", err.string.lines.last
  end

  def test_supported_methods_fiber_per_request_and_url_scheme
    app = lambda do |env|
      Thread.current[:leak] = (Thread.current[:leak] || 0) + 1
      [200, { "content-type" => "text/plain" }, ["#{env['rack.url_scheme']} #{Thread.current[:leak]}"]]
    end
    with_server(app, lint: false, supported_http_methods: %w[GET], fiber_per_request: true,
                     rack_url_scheme: "https", min_threads: 1, max_threads: 1) do |_server, port|
      2.times do
        assert_match(/\r\n\r\nhttps 1\z/, raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
      end
      reply = raw_request(port, "PROPFIND / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
      assert_match(%r{\AHTTP/1.1 501 }, reply)
      assert_match(/connection: close/i, reply)
      assert_match(/PROPFIND method is not supported/, reply)
    end
  end

  def test_idle_timeout_activity_reads_both_modes
    assert_equal [5, 1], Serval::IdleTimeout.activity(requests_count: 5, busy_threads: 1)
    cluster = { worker_status: [{ last_status: { requests_count: 2, busy_threads: 0 } }, { last_status: nil }] }
    assert_equal [2, 0], Serval::IdleTimeout.activity(cluster)
  end

  # Subprocess: every Puma 8 method in one file boots, serves, prints only the
  # documented lines, and the implemented options act.
  def test_every_puma_option_boots
    server = Serval::SubprocessServer.new(
      ["-C", "puma_every_option.rb"],
      files: { "config.ru" => Serval::SubprocessServer::HELLO, "puma_every_option.rb" => File.read(FIXTURE),
               "extra.rb" => "max_body 1_000_000\n", "tmp/.keep" => "", "log/.keep" => "" }
    ).start
    log = File.join(server.dir, "log/stdout.log")
    port = wait_file(log, %r{Listening on http://127\.0\.0\.1:(\d+)}, server)[1].to_i
    wait_file(log, /every-option: booted/, server) # the lead's after_booted
    assert_equal "hello\n", http(port, good_request("/")).body
    assert_match(/\[app\] Serval .* starting in cluster mode/, File.read(log))
    wait_file(File.join(server.dir, "tmp/serval.state"), /pid:/, server)
    assert_equal 0o640, File.stat(File.join(server.dir, "tmp/serval.state")).mode & 0o777
    status = server.stop
    assert status.success?, server.logs
    lines = (server.stderr + File.read(File.join(server.dir, "log/stderr.log"))).lines.map(&:chomp)
    allowed = [/\Aserval: force_shutdown_after 25 -> drain_timeout 25\.0\z/,
               /\Aserval: wait_for_less_busy_worker 0\.005 -> gvl_balance true\z/,
               /\Aserval: max_fast_inline 10 -> max_keepalive_requests 10\z/,
               /\Aserval: max_keep_alive 100 -> max_keepalive_requests 100\z/,
               /\Aserval: `io_selector_backend` has no effect in Serval/]
    noisy = lines.select { |l| l.match?(/ignored|not supported|has no effect|->/) }
    assert_equal [], noisy.reject { |l| allowed.any? { |re| l.match?(re) } }, server.logs
    assert_equal 5, noisy.size, server.logs
  ensure
    server&.cleanup(passed?)
  end

  # stdout_redirect: files at boot (append honoured), reopened by name on HUP.
  def test_stdout_redirect_and_hup_reopen
    server = Serval::SubprocessServer.new(
      ["-C", "c.rb"],
      files: { "config.ru" => Serval::SubprocessServer::HELLO, "out.log" => "old\n",
               "c.rb" => %(bind "tcp://127.0.0.1:0"\nstdout_redirect "out.log", "err.log"\nworkers 1\n) }
    ).start
    out = File.join(server.dir, "out.log")
    wait_file(out, /Listening on/, server)
    refute_match(/old/, File.read(out)) # not append: truncated
    File.rename(out, "#{out}.1")
    server.signal("HUP")
    wait_file(out, /Reopened/, server)
    assert_equal "", server.stdout
    assert server.stop.success?
    assert_match(/Goodbye/, File.read(out))
  ensure
    server&.cleanup(passed?)
  end

  def test_raise_exception_on_sigterm_ends_by_the_signal
    server = Serval::SubprocessServer.new(
      ["-C", "c.rb"],
      files: { "config.ru" => Serval::SubprocessServer::HELLO,
               "c.rb" => %(bind "tcp://127.0.0.1:0"\nraise_exception_on_sigterm\n) }
    ).boot
    server.signal("TERM")
    status = server.wait(10)
    assert_equal Signal.list["TERM"], status&.termsig, server.logs
  ensure
    server&.cleanup(passed?)
  end

  def test_idle_timeout_stops_the_server
    server = Serval::SubprocessServer.new(
      ["-C", "c.rb"],
      files: { "config.ru" => Serval::SubprocessServer::HELLO, "c.rb" => %(bind "tcp://127.0.0.1:0"\nidle_timeout 1\n) }
    ).boot
    status = server.wait(8)
    assert status&.success?, server.logs
    assert_match(/No request for 1\.0s \(idle_timeout\): stopping/, server.stdout)
  ensure
    server&.cleanup(passed?)
  end

  private

  def wait_file(path, pattern, server, timeout: 15)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      match = File.file?(path) && File.read(path).match(pattern)
      return match if match
      flunk("#{pattern.inspect} not in #{path}\n#{server.logs}") if server.exited? ||
                                                                  Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end
end
