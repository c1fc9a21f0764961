# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require "support/subprocess_server"

# Worker health in cluster mode: replacement after SIGKILL, check-in timeout,
# boot timeout, crash-loop backoff, workers leaving with their master.
class ClusterHealthTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  # Answers the worker's pid; "?hold" keeps the request 0.3 s in the app.
  PID_APP = %(run ->(env) { sleep 0.3 if env["QUERY_STRING"] == "hold"; [200, {"content-type" => "text/plain"}, [Process.pid.to_s]] }\n)

  def cluster(config, files: {})
    body = "bind 'tcp://127.0.0.1:0'\nthreads 1, 2\n#{config}"
    spawn_server(["-C", "c.rb"], files: { "config.ru" => PID_APP, "c.rb" => body }.merge(files)).boot
  end

  def worker_pid(server, index, except: nil)
    deadline = Time.now + 10
    loop do
      pids = server.stdout.scan(/Worker #{index} \(PID: (\d+)\) booted/).flatten.map(&:to_i)
      pid = (pids - [except]).last
      return pid if pid
      raise "worker #{index} never booted\n#{server.logs}" if Time.now > deadline

      sleep 0.01
    end
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def gone?(pid)
    state = File.read("/proc/#{pid}/stat")[/\) (\w)/, 1]
    state == "Z"
  rescue Errno::ENOENT, Errno::ESRCH
    true
  end

  def test_sigkilled_worker_is_replaced_and_serving_within_one_second
    server = cluster("workers 2\n")
    old = worker_pid(server, 0)
    worker_pid(server, 1)
    killed_at = now
    Process.kill("KILL", old)
    fresh = worker_pid(server, 0, except: old)
    # The new worker answers. Sequential requests could all go to the idle
    # sibling, so send 4 at once that each stay 0.3 s in the app: a worker has
    # at most 2 threads and accepts only while one is free, so at least two
    # of them must be answered by the replacement.
    seen = Array.new(4) do
      Thread.new { http(server.port, good_request("/?hold")).body.to_i }
    end.map(&:value)
    elapsed = now - killed_at
    assert_includes seen, fresh, server.logs
    assert_operator elapsed, :<, 1.0, "replacement took #{elapsed}s"
    assert_match(/Worker 0 \(PID: #{old}\) exited \(signal KILL\); respawning in 0\.0s \(failure 1 in a row\)/, server.stderr)
  end

  # Balancing: a worker accepts only while it has a free thread, counting
  # connections accepted whose request is still arriving. Four requests that
  # each stay 0.3 s in the app, sent at once to 2 workers x 2 threads, are
  # served two by each worker, all at the same time.
  def test_concurrent_requests_spread_over_workers_with_free_threads
    server = cluster("workers 2\n")
    worker_pid(server, 0)
    worker_pid(server, 1)
    6.times do
      pids = Array.new(4) do
        Thread.new { http(server.port, good_request("/?hold")).body.to_i }
      end.map(&:value)
      assert_equal [2, 2], pids.tally.values, "#{pids.inspect}\n#{server.logs}"
    end
  end

  def test_stuck_worker_is_killed_after_worker_timeout
    server = cluster("workers 2\nworker_timeout 1\nworker_check_interval 0.2\n")
    old = worker_pid(server, 1)
    Process.kill("STOP", old)
    server.wait_for(/Worker 1 \(PID: #{old}\) timed out \(no check-in for 1\.0s\); killing it/, stream: :err, timeout: 5)
    refute_equal old, worker_pid(server, 1, except: old)
  end

  def test_worker_that_never_boots_is_killed_after_worker_boot_timeout
    server = cluster("workers 1\nworker_boot_timeout 1\nbefore_worker_boot { |_i| sleep 30 }\n")
    server.wait_for(/Worker 0 \(PID: \d+\) timed out \(not booted after 1\.0s\); killing it/, stream: :err, timeout: 5)
    # A graceful stop kills a worker that is still booting instead of
    # waiting out the drain timeout for it (it has no request to finish).
    server.signal("TERM")
    refute_nil server.wait(5), "TERM with a worker stuck in before_worker_boot\n#{server.logs}"
  end

  def test_crash_loop_backs_off_and_is_logged
    server = cluster("workers 2\nbefore_worker_boot { |i| exit!(3) if i == 1 }\n")
    worker_pid(server, 0)
    server.wait_for(/Worker 1 .*status 3\); respawning in 1\.0s \(failure 3 in a row\)/, stream: :err, timeout: 5)
    lines = server.stderr.lines.grep(/Worker 1 .*respawning/)
    assert_match(/respawning in 0\.0s \(failure 1/, lines[0])
    assert_match(/respawning in 0\.5s \(failure 2/, lines[1])
    assert_equal 3, lines.size, "no fork bomb: #{lines.size} respawns"
    assert_equal 200, http(server.port, good_request("/")).status
  end

  def test_workers_exit_when_the_master_dies
    server = cluster("workers 2\n")
    pids = [worker_pid(server, 0), worker_pid(server, 1)]
    server.signal("KILL")
    server.wait(5)
    deadline = now + 5
    sleep 0.02 until pids.all? { |pid| gone?(pid) } || now > deadline
    assert(pids.all? { |pid| gone?(pid) }, "workers still alive: #{pids.reject { |p| gone?(p) }}")
  end
end
