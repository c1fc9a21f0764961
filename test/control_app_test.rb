# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "tmpdir"
require "yaml"
require "rack/lint"
require "rack/mock"
require "support/watched_io"
require "serval/control_app"
require "serval/control"
require "serval/launcher"

# The control app: every endpoint through #call, then served for real by
# Serval::Control on a unix socket, and wired into an in-process Launcher.
class ControlAppTest < Minitest::Test
  TOKEN = "t0ken"

  # Stands in for Serval::Launcher.
  class FakeLauncher
    attr_reader :commands, :options, :log_writer

    def initialize(options = {}, log_writer = nil)
      @commands = Queue.new
      @options = options
      @log_writer = log_writer
    end

    def stats
      { started_at: "2026-01-01T00:00:00Z", backlog: 0, running: 2, pool_capacity: 2, busy_threads: 0,
        max_threads: 2, requests_count: 7 }
    end

    def enqueue(command)
      @commands << command
      true
    end

    def thread_backtraces
      { "main (run)" => ["a.rb:1", "b.rb:2"] }
    end

    def wait_until_booted(_timeout)
      true
    end

    attr_reader :traced

    # JSON text, as Serval::Launcher#gvl_trace returns it
    def gvl_trace(seconds)
      @traced = seconds
      JSON.generate(traceEvents: [{ name: "x", ph: "B", pid: 1, tid: 2, ts: 0.5 }], otherData: { seconds: seconds })
    end
  end

  def setup
    @launcher = FakeLauncher.new
    @app = Rack::Lint.new(Serval::ControlApp.new(@launcher, token: TOKEN))
  end

  def get(path, query = "token=#{TOKEN}", app: @app, method: "GET")
    env = Rack::MockRequest.env_for("http://localhost#{path}?#{query}", method: method)
    status, headers, body = app.call(env)
    text = +""
    body.each { |chunk| text << chunk }
    body.close if body.respond_to?(:close)
    [status, headers, text.empty? ? nil : JSON.parse(text)]
  end

  def test_stats
    status, headers, json = get("/stats")
    assert_equal 200, status
    assert_equal "application/json", headers["content-type"]
    assert_equal 7, json["requests_count"]
    assert_equal %w[started_at backlog running pool_capacity busy_threads max_threads requests_count], json.keys
  end

  def test_thread_backtraces_and_gc_stats
    _, _, json = get("/thread-backtraces")
    assert_equal({ "main (run)" => ["a.rb:1", "b.rb:2"] }, json)
    status, _, json = get("/gc-stats")
    assert_equal 200, status
    assert_kind_of Integer, json["count"]
    assert json.key?("heap_live_slots")
  end

  def test_window
    window = { requests: 2, samples: [{ run: 0.001, idle: 0.002, wall: 0.003 }], processes: 1, missing: [] }
    @launcher.define_singleton_method(:window) { window }
    status, _, json = get("/window")
    assert_equal 200, status
    assert_equal 2, json["requests"]
    assert_equal [{ "run" => 0.001, "idle" => 0.002, "wall" => 0.003 }], json["samples"]
    @launcher.singleton_class.send(:remove_method, :window)
    @launcher.define_singleton_method(:window) { nil } # timing off
    status, _, json = get("/window")
    assert_equal 501, status
    assert_match(/timing is off/, json["error"])
  end

  def test_commands_are_enqueued
    { "/stop" => :stop, "/halt" => :halt, "/restart" => :restart, "/phased-restart" => :phased_restart,
      "/reopen-logs" => :reopen_logs }.each do |path, command|
      status, _, json = get(path)
      assert_equal 200, status, path
      assert_equal "ok", json["status"]
      assert_equal command, @launcher.commands.pop(true)
    end
  end

  def test_command_the_launcher_refuses_is_501
    launcher = FakeLauncher.new
    launcher.define_singleton_method(:enqueue) { |_c| false }
    status, _, json = get("/phased-restart", app: Serval::ControlApp.new(launcher, token: TOKEN))
    assert_equal 501, status
    assert_match(/not supported/, json["error"])
  end

  # A real single-mode launcher refuses the cluster-only commands, so the
  # control app's 501 is reachable (not only through a stub).
  def test_single_mode_refuses_cluster_only_commands
    require "serval/single"
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
    single = Serval::Single.new(Serval::Configuration::DEFAULTS, log_writer: log, signals: false)
    app = Serval::ControlApp.new(single, token: TOKEN)
    %w[/phased-restart].each do |path|
      status, _, json = get(path, app: app)
      assert_equal 501, status, path
      assert_match(/not supported/, json["error"])
    end
    assert_equal false, single.enqueue(:add_worker)
    assert_equal false, single.enqueue(:remove_worker)
  end

  def test_token_is_required
    assert_equal 403, get("/stats", "").first
    assert_equal 403, get("/stats", "token=wrong").first
    assert_equal 403, get("/stats", "token=#{TOKEN}x").first
    assert_equal 403, get("/stop", "").first
    assert_equal 403, get("/nope", "").first, "no token: 403 before 404"
    assert @launcher.commands.empty?
    assert_raises(ArgumentError) { Serval::ControlApp.new(@launcher, token: "") }
    assert_raises(ArgumentError) { Serval::ControlApp.new(@launcher, token: nil) }
  end

  def test_unknown_path_and_method
    status, _, json = get("/nope")
    assert_equal 404, status
    assert_match(/unknown command/, json["error"])
    assert_equal 405, get("/stop", method: "POST").first
  end

  def test_gvl_trace
    status, _, json = get("/gvl-trace", "token=#{TOKEN}&seconds=0.25")
    assert_equal 200, status
    assert_in_delta 0.25, @launcher.traced
    assert_equal({ "traceEvents" => [{ "name" => "x", "ph" => "B", "pid" => 1, "tid" => 2, "ts" => 0.5 }],
                   "otherData" => { "seconds" => 0.25 } }, json)
    assert_equal 400, get("/gvl-trace", "token=#{TOKEN}&seconds=-1").first
    assert_equal 400, get("/gvl-trace", "token=#{TOKEN}&seconds=abc").first
    assert_equal 400, get("/gvl-trace", "token=#{TOKEN}&seconds=61").first

    old_ruby = FakeLauncher.new
    old_ruby.define_singleton_method(:gvl_trace) { |_s| raise NotImplementedError, "GVL tracing needs Ruby 3.2+" }
    status, _, json = get("/gvl-trace", app: Serval::ControlApp.new(old_ruby, token: TOKEN))
    assert_equal [501, "GVL tracing needs Ruby 3.2+"], [status, json["error"]]
    bare = Object.new
    def bare.stats = {}
    status, _, json = get("/gvl-trace", app: Serval::ControlApp.new(bare, token: TOKEN))
    assert_equal 501, status
    assert_match(/not available/, json["error"])
  end

  # The real thing in single mode: the body is the trace object, encoded once.
  def test_single_mode_gvl_trace_body_is_the_trace_object
    Dir.mktmpdir do |dir|
      options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
        binds: ["tcp://127.0.0.1:0"], control_url: "unix://#{dir}/ctl.sock", control_auth_token: TOKEN
      ))
      out = Serval::WatchedIO.new
      app = ->(_env) { [200, { "content-type" => "text/plain" }, ["hi"]] }
      launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: out, stderr: StringIO.new),
                                               app: app, signals: false)
      thread = Thread.new { launcher.run }
      begin
        out.wait_for("* Control app on")
        head, body = unix_get("/gvl-trace?token=#{TOKEN}&seconds=0.2", "#{dir}/ctl.sock").split("\r\n\r\n", 2)
        if Serval::Native::GVL.supported?
          assert_match(%r{\AHTTP/1\.1 200 }, head)
          trace = JSON.parse(body)
          assert_kind_of Hash, trace, "one JSON.parse gives the trace object, not a string"
          assert_kind_of Array, trace["traceEvents"]
          refute_empty trace["traceEvents"]
          assert(trace["traceEvents"].all? { |e| e["pid"] == Process.pid })
          assert_equal 0, trace["otherData"]["dropped_events"]
        else
          assert_match(%r{\AHTTP/1\.1 501 }, head)
          assert_match(/needs Ruby 3\.2/, JSON.parse(body)["error"])
        end
      ensure
        launcher.stop
        assert_equal 0, thread.join(10)&.value
      end
    end
  end

  def test_non_finite_floats_become_strings
    launcher = FakeLauncher.new
    launcher.define_singleton_method(:stats) { { timing: { h: { buckets: [[0.1, 1], [Float::INFINITY, 2]] } } } }
    _, _, json = get("/stats", app: Serval::ControlApp.new(launcher, token: TOKEN))
    assert_equal [[0.1, 1], ["+Inf", 2]], json["timing"]["h"]["buckets"]
  end

  # The conversion the control app and a worker's check-in share.
  def test_json_safe_replaces_every_non_finite_float
    value = { a: [1.5, -Float::INFINITY, { b: Float::NAN }], c: "x", d: 2 }
    assert_equal({ a: [1.5, nil, { b: nil }], c: "x", d: 2 }, Serval::JSONSafe.convert(value) { nil })
    assert_equal({ a: [1.5, "-Infinity", { b: "NaN" }], c: "x", d: 2 }, Serval::JSONSafe.convert(value, &:to_s))
  end

  # --- served by Serval::Control ---

  def unix_get(path, sock)
    s = UNIXSocket.new(sock)
    s.write("GET #{path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    s.wait_readable(5)
    s.read
  ensure
    s&.close
  end

  def control_options(dir, **extra)
    Serval::Configuration::DEFAULTS.merge(control_url: "unix://#{dir}/ctl.sock", state_path: "#{dir}/run/state.yml",
                                          **extra)
  end

  def test_control_serves_on_unix_socket_with_generated_token_and_state_file
    Dir.mktmpdir do |dir|
      out = StringIO.new
      log = Serval::LogWriter.new(stdout: out, stderr: StringIO.new)
      control = Serval::Control.start(@launcher, control_options(dir), log)
      begin
        token = control.token
        assert_match(/\A\h{32}\z/, token)
        assert_includes out.string, "* Control app on unix://#{dir}/ctl.sock"
        assert_includes out.string, "Control token (generated): #{token}"
        state = YAML.safe_load(File.read("#{dir}/run/state.yml"))
        assert_equal({ "pid" => Process.pid, "control_url" => "unix://#{dir}/ctl.sock",
                       "control_auth_token" => token, "running_from" => Dir.pwd }, state)
        assert_equal 0o600, File.stat("#{dir}/run/state.yml").mode & 0o777
        assert_match(%r{\AHTTP/1\.1 200 .*"requests_count":7}m, unix_get("/stats?token=#{token}", "#{dir}/ctl.sock"))
        assert_match(%r{\AHTTP/1\.1 403 }, unix_get("/stats?token=bad", "#{dir}/ctl.sock"))
      ensure
        control.stop
      end
      refute File.exist?("#{dir}/ctl.sock")
      refute File.exist?("#{dir}/run/state.yml")
    end
  end

  # The operator's channel is hard to block: more half-open local connections
  # than the control server's slots delay /stats by less than a second (the
  # loop closes the ones making no progress), not by the 10 s read timeout.
  def test_half_open_connections_do_not_block_the_control_app
    Dir.mktmpdir do |dir|
      log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
      control = Serval::Control.start(@launcher, control_options(dir, control_auth_token: TOKEN), log)
      hogs = Array.new(Serval::Control::SERVER_OPTIONS[:max_connections] + 20) do |i|
        s = UNIXSocket.new("#{dir}/ctl.sock")
        s.write(i.even? ? "GET /stats?tok" : "G")
        s
      end
      sleep 0.3 # the hogs are older than the loop's eviction age
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      assert_match(%r{\AHTTP/1\.1 200 }, unix_get("/stats?token=#{TOKEN}", "#{dir}/ctl.sock"))
      assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 3
    ensure
      hogs&.each(&:close)
      control&.stop
    end
  end

  def test_forked_child_closes_the_control_listener
    Dir.mktmpdir do |dir|
      log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
      control = Serval::Control.start(@launcher, control_options(dir, control_auth_token: TOKEN), log)
      begin
        ios = control.instance_variable_get(:@parts).map { |binder, _| binder.ios }.flatten
        refute ios.empty?
        pid = fork { exit!(ios.all?(&:closed?) && File.socket?("#{dir}/ctl.sock") ? 0 : 1) }
        _, status = Process.wait2(pid)
        assert status.success?, "the child kept the control listener open"
        assert_match(%r{\AHTTP/1\.1 200 }, unix_get("/stats?token=#{TOKEN}", "#{dir}/ctl.sock"))
      ensure
        control.stop
      end
    end
  end

  def test_launcher_serves_control_app_and_stops_through_it
    Dir.mktmpdir do |dir|
      options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
        binds: ["tcp://127.0.0.1:0"], control_url: "unix://#{dir}/ctl.sock", control_auth_token: TOKEN
      ))
      out = Serval::WatchedIO.new
      app = ->(_env) { [200, { "content-type" => "text/plain" }, ["hi"]] }
      launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: out, stderr: StringIO.new),
                                               app: app, signals: false)
      thread = Thread.new { launcher.run }
      assert launcher.wait_until_booted(10), out.string
      # the control part starts right after boot, on its own thread: its log line is the handshake
      out.wait_for("* Control app on")
      response = unix_get("/stats?token=#{TOKEN}", "#{dir}/ctl.sock")
      json = JSON.parse(response.split("\r\n\r\n", 2).last)
      assert_equal 5, json["max_threads"]
      assert json.key?("started_at")
      # single mode reports every figure of Server#stats, as a cluster worker does
      assert_equal ["started_at", *launcher.server.stats.keys.map(&:to_s)].sort, json.keys.sort
      %w[connections accepted rejected min_threads].each { |key| assert_kind_of Integer, json[key], key }
      assert_equal "histogram", json.dig("timing", "queue_seconds", "type")
      assert json["timing"].key?("gvl_utilization")
      # the histograms count the application's requests, not the control app's
      port = launcher.urls.first[/:(\d+)\z/, 1].to_i
      assert_match(%r{\AHTTP/1\.1 200 }, raw_request(port, "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"))
      json = JSON.parse(unix_get("/stats?token=#{TOKEN}", "#{dir}/ctl.sock").split("\r\n\r\n", 2).last)
      assert_equal [1, 1], [json["requests_count"], json.dig("timing", "queue_seconds", "count")]
      assert_match(/"stop"/, unix_get("/stop?token=#{TOKEN}", "#{dir}/ctl.sock"))
      assert_equal 0, thread.join(10)&.value
      refute File.exist?("#{dir}/ctl.sock")
    end
  end

  # --- configuration ---

  def dsl_options(code)
    Dir.mktmpdir do |dir|
      File.write("#{dir}/serval.rb", code)
      warnings = []
      options = Serval::Configuration.load(config_file: "#{dir}/serval.rb", warn: ->(m) { warnings << m })
      [options, warnings]
    end
  end

  def test_activate_control_app_in_the_config_file
    options, warnings = dsl_options(%(activate_control_app "tcp://127.0.0.1:9293", { auth_token: "abc" }\n) +
                                    %(metrics_bind "tcp://127.0.0.1:9394"\nstate_path "tmp/serval.state"\n))
    assert_equal "tcp://127.0.0.1:9293", options[:control_url]
    assert_equal "abc", options[:control_auth_token]
    assert_equal "tcp://127.0.0.1:9394", options[:metrics_bind]
    assert_equal "tmp/serval.state", options[:state_path]
    assert_empty warnings
    _, warnings = dsl_options(%(activate_control_app "unix:///tmp/x.sock", data_only: true\n))
    assert_equal ["serval: activate_control_app: data_only is not supported and is ignored"], warnings
  end

  def test_activate_control_app_errors_name_the_option
    { %(activate_control_app "tcp://127.0.0.1:9293", no_token: true) => /activate_control_app: no_token is not supported/,
      %(activate_control_app) => /activate_control_app: give a URL/,
      %(activate_control_app "http://x:1") => /activate_control_app: expected tcp/,
      %(activate_control_app "tcp://127.0.0.1:99999") => /activate_control_app: bind tcp:.*port/,
      %(activate_control_app "tcp://127.0.0.1:1", bogus: 1) => /unknown option `bogus`/,
      %(metrics_bind "ssl://127.0.0.1:1") => /metrics_bind: expected tcp/ }.each do |code, message|
      error = assert_raises(Serval::ConfigError) { dsl_options("#{code}\n") }
      assert_match message, error.message
      assert_match(/serval\.rb:1: /, error.message)
    end
  end

  def test_cli_flags
    require "serval/cli"
    cli = Serval::CLI.new(%w[--control-url unix:///tmp/c.sock --control-token t --metrics-bind tcp://127.0.0.1:0 -S s.yml])
    cli.send(:parse)
    opts = cli.instance_variable_get(:@cli)
    assert_equal({ control_url: "unix:///tmp/c.sock", control_auth_token: "t", metrics_bind: "tcp://127.0.0.1:0",
                   state_path: "s.yml" }, opts)
  end
end
