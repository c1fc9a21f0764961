# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "tmpdir"
require "yaml"
require "fileutils"
require "serval/launcher"
require "support/subprocess_server"
require "serval/serval_ext"

# Subprocess tier: a real exe/serval with a control app on a unix socket in
# its temp dir, driven by a real exe/servalctl.
class ServalctlTest < Minitest::Test
  include Serval::SubprocessHelpers

  CTL = File.join(Serval::SubprocessServer::ROOT, "exe", "servalctl")
  TOKEN = "ctl-test-token"

  Result = Struct.new(:status, :out, :err)

  def setup
    @empty = Dir.mktmpdir("servalctl-cwd-")
  end

  def teardown
    FileUtils.rm_rf(@empty)
  end

  # Runs servalctl in chdir (default: an empty directory, so no
  # ./tmp/serval.state or config file is found) with env on top of a
  # SERVAL_CONTROL_URL/TOKEN-free environment; kills it after timeout seconds.
  def ctl(*args, timeout: 15, chdir: @empty, env: {})
    out_r, out_w = IO.pipe
    err_r, err_w = IO.pipe
    env = { "SERVAL_CONTROL_URL" => nil, "SERVAL_CONTROL_TOKEN" => nil }.merge(env)
    pid = Process.spawn(env, RbConfig.ruby, "-w", CTL, *args, out: out_w, err: err_w, in: File::NULL, chdir: chdir)
    [out_w, err_w].each(&:close)
    readers = [Thread.new { out_r.read }, Thread.new { err_r.read }]
    waiter = Process.detach(pid)
    unless waiter.join(timeout)
      Process.kill("KILL", pid)
      flunk "servalctl #{args.join(' ')} did not finish within #{timeout}s"
    end
    Result.new(waiter.value.exitstatus, *readers.map(&:value))
  ensure
    [out_r, err_r].each { |io| io&.close }
  end

  def boot(*extra, files: { "config.ru" => Serval::SubprocessServer::HELLO })
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "2", *extra], files: files)
    server.start
    server.wait_for(/\* Control app on unix:/)
    server
  end

  def sock(server)
    "unix://#{server.dir}/ctl.sock"
  end

  def test_stats_status_and_stop
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    url = ["--control-url", sock(server), "--control-token", TOKEN]

    stats = ctl(*url, "stats")
    assert_equal 0, stats.status, stats.err
    json = JSON.parse(stats.out)
    assert_equal 2, json["max_threads"]
    expected = %w[accepted backlog busy_threads connections max_threads min_threads pool_capacity rejected
                  requests_count running started_at timing]
    assert_empty expected - json.keys, "single-mode stats carry every Server#stats figure"
    assert_equal "histogram", json.dig("timing", "queue_seconds", "type")

    status = ctl(*url, "status")
    assert_equal 0, status.status
    assert_match(%r{serval is running \(single\): 0/2 threads busy}, status.out)

    traces = ctl(*url, "thread-backtraces")
    assert_equal 0, traces.status
    assert_match(/^serval-worker-\d+ .*:\n    /, traces.out)

    gc = ctl(*url, "gc-stats")
    assert_kind_of Integer, JSON.parse(gc.out)["count"]

    check_gvl_trace(url, server, [server.pid])

    stop = ctl(*url, "stop")
    assert_equal [0, "stop: sent\n"], [stop.status, stop.out]
    status = server.wait(10)
    assert status&.success?, "server did not exit 0 after servalctl stop\n#{server.logs}"
    assert_includes server.stdout, "- Goodbye!"
  end

  # gvl-trace prints the trace itself (one JSON object), or writes it with -o.
  def check_gvl_trace(url, server, pids)
    trace = ctl(*url, "gvl-trace", "--seconds", "0.2")
    unless Serval::Native::GVL.supported?
      assert_equal 1, trace.status
      return assert_match(/gvl-trace failed: 501 GVL tracing needs Ruby 3\.2/, trace.err)
    end

    assert_equal 0, trace.status, trace.err
    json = JSON.parse(trace.out)
    assert_kind_of Hash, json, "stdout is the trace object, not a JSON string"
    assert_equal pids.sort, json["traceEvents"].map { |e| e["pid"] }.uniq.sort
    saved = ctl(*url, "gvl-trace", "--seconds", "0.2", "-o", File.join(server.dir, "trace.json"))
    assert_equal 0, saved.status, saved.err
    assert_match(/\Agvl-trace: wrote \S+trace\.json \(\d+ events\)\n\z/, saved.out)
    assert_kind_of Array, JSON.parse(File.read(File.join(server.dir, "trace.json")))["traceEvents"]
  end

  # Also: the default state file in cluster mode is the master's.
  def test_cluster_mode_backtraces_and_trace_come_from_the_workers
    server = boot("-w", "2", "--control-url", "unix://ctl.sock", "--control-token", TOKEN, files: APP_WITH_TMP)
    pids = 2.times.map { |i| server.wait_for(/Worker #{i} \(PID: (\d+)\)/)[1].to_i }
    state = YAML.safe_load(File.read(File.join(server.dir, "tmp", "serval.state")))
    assert_equal [server.pid, sock(server), TOKEN], state.values_at("pid", "control_url", "control_auth_token")
    assert_equal 0, ctl("status", chdir: server.dir).status, "found by ./tmp/serval.state"
    url = ["--control-url", sock(server), "--control-token", TOKEN]
    traces = ctl(*url, "thread-backtraces")
    assert_equal 0, traces.status, traces.err
    assert_match(/^master \(pid #{server.pid}\):\n  \S/, traces.out)
    pids.each_with_index { |pid, i| assert_match(/^worker #{i} \(pid #{pid}\):\n  \S.*:\n      \S/, traces.out) }
    check_gvl_trace(url, server, pids)
  end

  def test_state_file_with_generated_token_then_halt
    server = boot("--control-url", "unix://ctl.sock", "-S", "run/serval.state")
    generated = server.wait_for(/Control token \(generated\): (\h+)/)[1]
    state = File.join(server.dir, "run", "serval.state")
    assert_includes File.read(state), generated

    stats = ctl("-S", state, "stats")
    assert_equal 0, stats.status, stats.err
    halt = ctl("-S", state, "halt")
    assert_equal 0, halt.status, halt.err
    assert server.wait(10)&.success?, server.logs
    refute File.exist?(state), "the state file is removed on exit"
  end

  def test_errors_and_exit_codes
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)

    bad = ctl("--control-url", sock(server), "--control-token", "wrong", "stats")
    assert_equal 1, bad.status
    assert_match(/stats failed: 403/, bad.err)

    gone = ctl("--control-url", "unix://#{server.dir}/missing.sock", "--control-token", TOKEN, "stats")
    assert_equal 3, gone.status
    assert_match(/cannot reach the server at unix:/, gone.err)

    usage = ctl("--control-url", sock(server), "--control-token", TOKEN, "bogus")
    assert_equal 2, usage.status
    assert_match(/unknown command bogus/, usage.err)

    nothing = ctl("-F", "-", "stats")
    assert_equal 2, nothing.status
    assert_match(/no control URL: give -C URL/, nothing.err)
  end

  APP_WITH_TMP = { "config.ru" => Serval::SubprocessServer::HELLO, "tmp/.keep" => "" }.freeze

  # Without state_path, a server with a control app writes tmp/serval.state
  # (0600) when the app has a tmp/; servalctl run there needs no option.
  def test_default_state_file_under_tmp
    server = boot("--control-url", "unix://ctl.sock", files: APP_WITH_TMP)
    token = server.wait_for(/Control token \(generated\): (\h+)/)[1]
    state = File.join(server.dir, "tmp", "serval.state")
    assert_equal 0o600, File.stat(state).mode & 0o777
    assert_equal({ "pid" => server.pid, "control_url" => sock(server), "control_auth_token" => token,
                   "running_from" => File.realpath(server.dir) },
                 YAML.safe_load(File.read(state)).tap { |h| h["running_from"] = File.realpath(h["running_from"]) })

    status = ctl("status", chdir: server.dir)
    assert_equal 0, status.status, status.err
    assert_match(/serval is running \(single\)/, status.out)
    assert_equal 0, ctl("stop", chdir: server.dir).status
    assert server.wait(10)&.success?, server.logs
    refute File.exist?(state), "removed at a clean exit"
    gone = ctl("status", chdir: server.dir)
    assert_equal 2, gone.status, "no state file, no config: nothing names a server"
  end

  # No tmp/: nothing is created, nothing is written.
  def test_no_default_state_file_without_tmp
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    assert_equal 0, ctl("--control-url", sock(server), "--control-token", TOKEN, "status").status
    refute Dir.exist?(File.join(server.dir, "tmp")), "tmp/ is not created"
  end

  def test_control_url_and_token_from_the_environment
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    env = { "SERVAL_CONTROL_URL" => sock(server), "SERVAL_CONTROL_TOKEN" => TOKEN }
    status = ctl("status", env: env)
    assert_equal 0, status.status, status.err

    # the environment goes before ./tmp/serval.state and the config file
    app = fake_app("tmp/serval.state" => YAML.dump("pid" => 1, "control_url" => "unix:///nonexistent/ctl.sock",
                                                   "control_auth_token" => "stale"),
                   "config/puma.rb" => %(activate_control_app "unix:///nonexistent/other.sock", auth_token: "x"\n))
    assert_equal 0, ctl("status", chdir: app, env: env).status
    # a flag beats the environment
    assert_equal 1, ctl("-T", "wrong", "status", env: env).status
    only_token = ctl("status", env: { "SERVAL_CONTROL_TOKEN" => TOKEN })
    assert_equal 2, only_token.status
    assert_match(/no control URL/, only_token.err)
  end

  # A config file that boots the app (and here would leave a marker and
  # raise if it ran): servalctl reads its literal control URL and token
  # without running it, from the default config/puma.rb and from -F.
  def test_config_file_is_never_run
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    app = fake_app("config/puma.rb" => <<~RUBY)
      require_relative "environment"
      threads 2, 2
      activate_control_app "#{sock(server)}", auth_token: "#{TOKEN}"
    RUBY
    status = ctl("status", chdir: app)
    assert_equal 0, status.status, status.err
    assert_match(/serval is running/, status.out)
    explicit = ctl("-F", File.join(app, "config", "puma.rb"), "stats")
    assert_equal 0, explicit.status, explicit.err
    old_flag = ctl("-C", File.join(app, "config", "puma.rb"), "status")
    assert_equal 0, old_flag.status, old_flag.err
    assert_match(/-C is the control URL \(as in pumactl\); reading \S+puma\.rb as a config file: use -F/, old_flag.err)
    refute File.exist?(File.join(app, "booted")), "the config file (or the app it loads) ran"
  end

  # A control URL the file computes cannot be read without running it.
  def test_config_file_with_a_computed_control_url
    app = fake_app("config/puma.rb" => <<~RUBY)
      require_relative "environment"
      activate_control_app "unix://\#{ENV.fetch('SOCK_DIR')}/ctl.sock", auth_token: "t"
    RUBY
    result = ctl("status", chdir: app)
    assert_equal 2, result.status
    assert_equal "servalctl: config/puma.rb: line 2: `activate_control_app` is not given a literal string: " \
                 "cannot read without running the file: pass -S or -C\n", result.err
    token = fake_app("config/serval.rb" => %(activate_control_app "unix://ctl.sock", auth_token: ENV["T"]\n))
    result = ctl("status", chdir: token)
    assert_equal 2, result.status
    assert_match(/config\/serval\.rb: line 1: `activate_control_app auth_token:` is not given a literal string: cannot read/,
                 result.err)
    refute File.exist?(File.join(app, "booted"))
  end

  # An app directory whose config/environment.rb leaves a marker and raises
  # if anything loads it.
  def fake_app(files)
    dir = File.join(@empty, "app#{@apps = (@apps || 0) + 1}")
    files = { "config/environment.rb" => %(File.write(File.join(__dir__, "..", "booted"), "x")\nraise "the app booted"\n) }
            .merge(files)
    files.each do |path, body|
      FileUtils.mkdir_p(File.dirname(File.join(dir, path)))
      File.write(File.join(dir, path), body)
    end
    dir
  end
  # A control listener that cannot be bound is a boot error: exit 1, named.
  def test_control_url_that_cannot_bind_fails_boot_with_exit_1
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1", "--control-url", "unix:///nonexistent-dir/ctl.sock",
                           "--control-token", "t"])
    server.start
    status = server.wait(20)
    refute_nil status, "the server exits by itself"
    assert_equal 1, status.exitstatus, server.logs
    assert_match(%r{control/metrics/state_path could not start}, server.stderr)
  end

  # advise --from: a saved window (here built like bench/window_from_log's)
  # or a stats snapshot holding one; computed by servalctl itself.
  def test_advise_from_a_saved_window
    require "support/advice_windows"
    Dir.mktmpdir("servalctl-advise") do |dir|
      window = File.join(dir, "window.json")
      File.write(window, JSON.generate(AdviceWindows.window(1500)))
      table = ctl("advise", "--from", window, "--target-rps", "250", "--html", File.join(dir, "r.html"))
      assert_equal 0, table.status, table.err
      assert_match(/^threads +req\/s +gain +stall mean +p50 +p99$/, table.out)
      assert_match(/^Advice: \d+ threads(?: \(\d+-\d+\))? x \d+ processes per machine$/, table.out)
      assert_match(/^  for 250 req\/s: \d+ machines x/, table.out)
      assert_includes table.out, "Report written to #{dir}/r.html"
      assert_includes File.read(File.join(dir, "r.html")), "<svg"

      snapshot = File.join(dir, "stats.json")
      File.write(snapshot, JSON.generate(started_at: "2026-01-01T00:00:00Z", max_threads: 3,
                                         window: AdviceWindows.window(1500)))
      json = ctl("advise", "--from", snapshot, "--json", "--machines", "3", "--extra-connections", "5",
                 "--db-max-connections", "40")
      assert_equal 0, json.status, json.err
      assert_equal 1, json.out.lines.size, "one JSON object"
      a = JSON.parse(json.out)
      assert_kind_of Integer, a["threads"]
      assert_kind_of Integer, a["processes"]
      assert_includes 0.0..1.0, a["cpu_share"]
      assert_kind_of Float, a["max_rps_per_process"]
      assert_equal 1500, a["requests"]
      assert(a["warnings"].all?(String))
      assert_equal [3, 5, 40], a["database"].values_at("machines", "extra", "max_connections")

      saved = File.join(dir, "advice.json")
      File.write(saved, json.out)
      again = ctl("advise", "--from", saved, "--html", File.join(dir, "again.html"))
      assert_equal 0, again.status, again.err
      assert_match(/^Advice: #{a['threads']} threads(?: \(\d+-\d+\))? x #{a['processes']} processes per machine$/, again.out)
    end
  end

  def test_advise_from_files_without_a_window
    Dir.mktmpdir("servalctl-advise") do |dir|
      stats = File.join(dir, "stats.json")
      File.write(stats, JSON.generate(started_at: "2026-01-01T00:00:00Z", max_threads: 3))
      no_window = ctl("advise", "--from", stats)
      assert_equal 1, no_window.status
      assert_match(/holds no measurement window .*`servalctl stats --json` without --window.*stats --json --window/,
                   no_window.err)
      File.write(stats, "not json")
      assert_match(/--from .*not JSON/, ctl("advise", "--from", stats).err)
      little = File.join(dir, "little.json")
      File.write(little, JSON.generate(requests: 12, samples: [{ run: 0.01, idle: 0.01 }] * 12))
      few = ctl("advise", "--from", little)
      assert_equal 0, few.status, few.err
      assert_match(/^No advice yet: 12 requests measured, need 300$/, few.out)
      assert_equal 2, ctl("advise", "--from", little, "--machines", "0").status
    end
  end

  # Live: /advice needs the server's measurement window (Launcher#window).
  # A build without it answers 501, and stats --window says it has none.
  def test_advise_from_the_server
    server = boot("--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    url = ["--control-url", sock(server), "--control-token", TOKEN]
    live = ctl(*url, "advise", "--json")
    stats = ctl(*url, "stats", "--json", "--window")
    if Serval::Launcher.method_defined?(:window)
      assert_equal 0, live.status, live.err
      assert_match(/requests measured, need/, JSON.parse(live.out)["warnings"].first, "an idle server has too few")
      assert_equal 0, stats.status, stats.err
      assert_kind_of Hash, JSON.parse(stats.out)["window"]
    else
      assert_equal [1, "servalctl: advise failed: 501 no measurement window in this build\n"], [live.status, live.err]
      assert_equal 1, stats.status
      assert_match(/stats --window: the server has no measurement window \(404\); stats only/, stats.err)
      assert_equal 2, JSON.parse(stats.out)["max_threads"], "the stats are still printed"
    end
  end

end
