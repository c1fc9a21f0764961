# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "support/subprocess_server"
require "serval/serval_ext"

# The control app of a real cluster (exe/serval -w 2): the GVL trace and the
# thread backtraces come from the workers, which serve the requests, not
# from the master.
class ClusterControlTest < Minitest::Test
  include Serval::SubprocessHelpers

  TOKEN = "cluster-ctl"

  def boot(config = "")
    files = { "config.ru" => Serval::SubprocessServer::HELLO, "serval.rb" => config }
    server = spawn_server(["-C", "serval.rb", "-w", "2", "-t", "1:2", "-b", "tcp://127.0.0.1:0",
                           "--control-url", "unix://ctl.sock", "--control-token", TOKEN], files: files).boot
    server.wait_for(/\* Control app on unix:/)
    2.times { |i| server.wait_for(/Worker #{i}\b.*booted/) }
    server
  end

  # [status, parsed body] of GET path on the control socket.
  def control(server, path)
    socket = UNIXSocket.new(File.join(server.dir, "ctl.sock"))
    socket.write("GET #{path}#{path.include?('?') ? '&' : '?'}token=#{TOKEN} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    head, body = socket.read.split("\r\n\r\n", 2)
    [head[%r{\AHTTP/1\.1 (\d+)}, 1].to_i, JSON.parse(body)]
  ensure
    socket&.close
  end

  def worker_pids(server)
    _, stats = control(server, "/stats")
    assert_equal [true, true], stats["worker_status"].map { |w| w["booted"] }
    stats["worker_status"].to_h { |w| [w["index"], w["pid"]] }
  end

  def test_thread_backtraces_come_from_every_worker
    server = boot
    pids = worker_pids(server)
    status, json = control(server, "/thread-backtraces")
    assert_equal 200, status
    assert_equal pids, json["workers"].to_h { |w| [w["index"], w["pid"]] }
    refute_includes pids.values, server.pid
    json["workers"].each do |w|
      frames = w["threads"].values.flatten
      assert(frames.any? { |f| f.include?("cluster/worker.rb") }, "worker #{w['index']}: its own supervise loop")
    end
    assert_equal server.pid, json["master"]["pid"]
    assert_empty json["missing"]
  end

  # The trace records for longer than worker_timeout: a worker whose
  # supervise loop waited for it would miss its check-ins and be killed.
  def test_gvl_trace_merges_the_workers_traces
    server = boot("worker_timeout 1.5\nworker_check_interval 0.25\n")
    pids = worker_pids(server)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    status, trace = control(server, "/gvl-trace?seconds=2.5")
    elapsed_us = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1e6
    unless Serval::Native::GVL.supported?
      assert_equal 501, status
      return assert_match(/needs Ruby 3\.2/, trace["error"])
    end

    assert_equal 200, status, trace.inspect
    assert_kind_of Hash, trace, "one JSON.parse gives the trace object"
    events = trace.fetch("traceEvents")
    assert_equal pids.values.sort, events.map { |e| e["pid"] }.uniq.sort, "one process per worker, not the master"
    names = events.select { |e| e["name"] == "process_name" }.to_h { |e| [e["pid"], e["args"]["name"]] }
    assert_equal pids.to_h { |i, pid| [pid, "worker #{i}"] }, names
    # one clock: every worker's slices lie inside the request, counted from
    # the master's origin (a trace counted from its own start begins at 0)
    events.reject { |e| e["ph"] == "M" }.group_by { |e| e["pid"] }.each do |pid, list|
      first, last = list.map { |e| e["ts"] }.minmax
      assert_operator first, :>, 0, "worker #{pid}"
      assert_operator last, :<, elapsed_us, "worker #{pid}"
    end
    assert_equal pids.values.sort, trace["otherData"]["workers"].map { |w| w["pid"] }.sort
    assert_empty trace["otherData"]["missing"]
    assert_equal pids, worker_pids(server), "the same workers, none killed for a missed check-in"
    refute_match(/timed out/, server.stderr + server.stdout)
  end
  # Requests spread over both workers (each connection is one request; the
  # kernel and balance pick the worker): the window is the sum of theirs.
  def test_window_merges_the_workers_windows
    server = boot
    pids = worker_pids(server)
    40.times do
      TCPSocket.open("127.0.0.1", server.port) do |s|
        s.write("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert_match(%r{\AHTTP/1\.1 200}, s.read)
      end
    end
    status, w = control(server, "/window")
    assert_equal 200, status, w.inspect
    assert_equal 2, w["processes"]
    assert_empty w["missing"]
    assert_equal pids, w["per_process"].to_h { |p| [p["index"], p["pid"]] }
    assert_equal 40, w["requests"]
    assert_equal 40, w["per_process"].sum { |p| p["requests"] }
    assert_equal 40, w["histograms"]["wall"]["counts"].sum
    assert_equal Serval::Native::GVL.supported?, w["gvl_split"]
    assert_operator w["samples"].size, :<=, 40
    _, stats = control(server, "/stats")
    refute_includes JSON.generate(stats), "samples", "the samples stay out of /stats and check-ins"
  end
end
