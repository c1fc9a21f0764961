# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require "socket"

# Puma plugins under the real exe/serval: a plugin of our own that prints
# what Puma's API gives it (test/fixtures/plugins/puma/plugin/serval_probe.rb),
# run with Serval's stand-in API (this bundle has no puma) and with the real
# puma gem beside real plugins from RubyGems (test/plugins/Gemfile:
# puma-plugin-statsd, yabeda-puma-plugin), and Puma's hooks.
class PumaPluginsTest < Minitest::Test
  include Serval::SubprocessHelpers

  ROOT = File.expand_path("..", __dir__)
  FIXTURES = File.join(__dir__, "fixtures", "plugins")
  PLUGINS_GEMFILE = File.join(__dir__, "plugins", "Gemfile")
  GET = "GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"

  def test_stand_in_api_runs_a_plugin_through_boot_restart_and_stop
    config = <<~RUBY
      plugin :serval_probe
      probe_mode :async
      bind "tcp://127.0.0.1:0"
    RUBY
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => Serval::SubprocessServer::HELLO, "c.rb" => config },
                                          env: probe_env).boot
    server.wait_for(/probe: json/)
    out = server.stdout
    assert_includes out, "probe: config true\n"
    assert_includes out, "probe: start mode=:async workers=0 puma=8.0.0 max_threads=5\n" # the stand-in's API version
    assert_match(/^probe: background puma plgn bg 0$/, out)
    assert_match(/^probe: booted keys=.*\bbusy_threads\b.*\bmax_threads\b.*\bpool_capacity\b.*\brequests_count\b.*\brunning\b/, out)
    assert_includes out, "probe: json true\n"
    assert_includes out, "* Puma plugins: serval_probe (config file c.rb)\n"
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))

    server.signal("USR2") # hot restart: before_restart, then the new process starts the plugin again
    server.wait_for(/probe: restart/)
    server.wait_for_count(/probe: json/, 2, timeout: 15)
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET, read_timeout: 10))
    assert_equal 0, server.stop.exitstatus
    assert_equal 1, server.stdout.scan("probe: stopped").size, server.logs
    refute_match(/warning|failed/i, server.stderr)
  end

  def test_unknown_plugin_fails_the_boot_naming_it
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => Serval::SubprocessServer::HELLO,
                                                   "c.rb" => "plugin :no_such_plugin\n" }).start
    assert server.wait(15), "did not exit"
    refute server.status.success?
    assert_match(/c\.rb:1: plugin :no_such_plugin: .*puma\/plugin\/no_such_plugin\.rb is not on the load path/, server.stderr)
  end

  # The real puma gem is loaded for the API (its Const::VERSION, not the
  # stand-in's), in cluster mode; puma-plugin-statsd sends its gauges over
  # UDP and yabeda-puma-plugin reads the control app's /stats.
  def test_real_plugins_with_the_real_puma_gem_in_cluster_mode
    skip "test/plugins/Gemfile is not installed (BUNDLE_GEMFILE=test/plugins/Gemfile bundle install)" unless plugins_bundle?

    udp = UDPSocket.new
    udp.bind("127.0.0.1", 0)
    control = Serval::SubprocessServer.free_port
    config = <<~RUBY
      plugin :serval_probe
      plugin :statsd
      plugin :yabeda
      activate_control_app "tcp://127.0.0.1:#{control}", auth_token: "t0ken"
      workers 2
      bind "tcp://127.0.0.1:0"
      on_worker_boot(:probe) { |index, data| data[:index] = index }
      on_worker_shutdown(:probe) { |index, data| puts "hook: worker \#{index} data \#{data.inspect}" }
    RUBY
    app = <<~RUBY
      require "yabeda/prometheus"
      Yabeda.configure!
      use Yabeda::Prometheus::Exporter
      run ->(env) { [200, { "content-type" => "text/plain" }, ["hello\\n"]] }
    RUBY
    env = probe_env.merge("BUNDLE_GEMFILE" => PLUGINS_GEMFILE, "STATSD_HOST" => "127.0.0.1",
                          "STATSD_PORT" => udp.addr[1].to_s, "STATSD_INTERVAL_SECONDS" => "0.2")
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => app, "c.rb" => config }, env: env).boot
    server.wait_for(/probe: booted keys=/, timeout: 20)
    assert_includes server.stdout, "probe: start mode=nil workers=2 puma=#{locked_puma_version} "
    assert_match(/^probe: booted keys=.*\bbooted_workers\b.*\bworker_status\b.*\bworkers\b/, server.stdout)

    gauges = []
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 15
    until gauges.include?("puma.workers:2|g") && gauges.any? { |g| g.start_with?("puma.running:") }
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flunk "statsd plugin sent #{gauges.inspect}\n#{server.logs}" if left <= 0 || !udp.wait_readable(left)
      gauges.concat(udp.recvfrom(4096).first.split("\n"))
    end
    assert_includes gauges, "puma.booted_workers:2|g"

    metrics = raw_request(server.port, "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", read_timeout: 10)
    assert_match(/^puma_running\{index="0"\} \d/, metrics)
    assert_match(/^puma_max_threads\{index="1"\} 5/, metrics)

    assert_equal 0, server.stop(term_timeout: 20).exitstatus
    assert_includes server.stdout, "hook: worker 0 data {:index=>0}"
    assert_includes server.stdout, "probe: stopped"
  ensure
    udp&.close
  end

  # Puma's thread hooks run in each request thread; out_of_band when a
  # request ends with none other in flight; keyed worker hooks share data.
  def test_thread_out_of_band_and_worker_fork_hooks
    config = <<~RUBY
      threads 1, 1
      workers 1
      bind "tcp://127.0.0.1:0"
      before_worker_fork { |index| puts "hook: fork \#{index} in \#{Process.pid}" }
      on_thread_start { puts "hook: thread start \#{Thread.current.name}" }
      before_thread_exit { puts "hook: thread exit" }
      out_of_band { puts "hook: oob" }
      after_booted { puts "hook: booted" }
      on_stopped { puts "hook: stopped" }
    RUBY
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => Serval::SubprocessServer::HELLO, "c.rb" => config }).boot
    server.wait_for(/hook: booted/)
    assert_match(/^hook: fork 0 in #{server.pid}$/, server.stdout)
    server.wait_for(/hook: thread start serval-worker-1/)
    refute_includes server.stdout, "hook: oob"
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    server.wait_for(/hook: oob/)
    assert_equal 0, server.stop.exitstatus
    assert_includes server.stdout, "hook: thread exit"
    assert_includes server.stdout, "hook: stopped"
  end

  private

  def probe_env
    { "RUBYOPT" => [ENV["RUBYOPT"], "-rbundler/setup", "-I#{FIXTURES}"].compact.join(" ") }
  end

  def plugins_bundle?
    system({ "BUNDLE_GEMFILE" => PLUGINS_GEMFILE, "RUBYOPT" => nil }, "bundle", "check", out: File::NULL, err: File::NULL)
  end

  def locked_puma_version
    File.read("#{PLUGINS_GEMFILE}.lock")[/^    puma \(([^)]+)\)/, 1]
  end
end
