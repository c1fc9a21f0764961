# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "support/subprocess_server"
require "serval/serval_ext"

# Subprocess tier: a real exe/serval with a control app on a unix socket in
# its temp dir, driven by a real exe/servalctl.
class ServalctlTest < Minitest::Test
  include Serval::SubprocessHelpers

  CTL = File.join(Serval::SubprocessServer::ROOT, "exe", "servalctl")
  TOKEN = "ctl-test-token"

  Result = Struct.new(:status, :out, :err)

  # Runs servalctl; kills it after timeout seconds.
  def ctl(*args, timeout: 15)
    out_r, out_w = IO.pipe
    err_r, err_w = IO.pipe
    pid = Process.spawn(RbConfig.ruby, "-w", CTL, *args, out: out_w, err: err_w, in: File::NULL)
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

  def boot(*extra)
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "2", *extra])
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

  def test_cluster_mode_backtraces_and_trace_come_from_the_workers
    server = boot("-w", "2", "--control-url", "unix://ctl.sock", "--control-token", TOKEN)
    pids = 2.times.map { |i| server.wait_for(/Worker #{i} \(PID: (\d+)\)/)[1].to_i }
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

    nothing = ctl("-C", "-", "stats")
    assert_equal 2, nothing.status
    assert_match(/no control URL/, nothing.err)
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
end
