# frozen_string_literal: true

require_relative "test_helper"
require "support/subprocess_server"
require "support/http_wire"
require "serval/signals"

# Every signal of docs/signals.md against the real executable.
class SignalsTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  APP = <<~'RUBY'
    run lambda { |env|
      seconds = Float(env["QUERY_STRING"][/sleep=([\d.]+)/, 1] || 0)
      if seconds.positive?
        $stdout.puts "app: sleeping #{seconds}" # the test waits for this line
        $stdout.flush
      end
      sleep seconds
      [200, {"content-type" => "text/plain"}, [Process.pid.to_s]]
    }
  RUBY

  def cluster(extra = "", workers: 2, args: [])
    config = "bind 'tcp://127.0.0.1:0'\nthreads 1, 2\nworkers #{workers}\n#{extra}"
    spawn_server(["-C", "c.rb", *args], files: { "config.ru" => APP, "c.rb" => config }).boot
  end

  def booted(server, count)
    server.wait_for_count(/Worker \d+ \(PID: (\d+)\) booted/, count).map { |m| m[1].to_i }
  end

  def get(port, query = "")
    http(port, good_request("/?#{query}", host: "127.0.0.1"), timeout: 10)
  end

  # A request the app is in (it sleeps seconds); the thread's value is the
  # response, or the error a fast stop caused.
  def request_in_the_app(server, seconds)
    slow = Thread.new do
      get(server.port, "sleep=#{seconds}")
    rescue StandardError => e
      e
    end
    server.wait_for(/app: sleeping #{seconds}/)
    slow
  end

  def test_term_drains_in_flight_requests_then_exits
    server = cluster
    booted(server, 2)
    slow = Thread.new { get(server.port, "sleep=0.5") }
    server.wait_for(/app: sleeping 0.5/) # the request is in the app
    server.signal("TERM")
    assert_equal 200, slow.value.status
    assert server.wait(10)
    assert server.status.success?, server.logs
    assert_includes server.stdout, "- Gracefully stopping"
    assert_includes server.stdout, "- Goodbye!"
  end

  def test_quit_is_graceful_too
    server = cluster
    booted(server, 2)
    server.signal("QUIT")
    assert server.wait(10)
    assert server.status.success?
    assert_includes server.stdout, "- Gracefully stopping"
  end

  def test_int_stops_fast_even_with_a_slow_request
    server = cluster
    booted(server, 2)
    slow = request_in_the_app(server, 5)
    t = Time.now
    server.signal("INT")
    assert server.wait(5)
    assert_operator Time.now - t, :<, 3
    assert_includes server.stdout, "- Stopping now"
    slow.join(5)
  end

  def test_ttin_and_ttou_add_and_remove_a_worker
    server = cluster
    booted(server, 2)
    server.signal("TTIN")
    server.wait_for(/Worker 2 \(PID: \d+\) booted/)
    server.signal("TTOU")
    server.wait_for(/- Stopping worker 2 \(PID: \d+\)/)
    server.wait_for(/- Workers: 2/)
    assert_equal 200, get(server.port).status
  end

  # worker_culling_strategy :oldest: TTOU stops the worker that has run
  # longest (index 0 here), and TTIN fills the lowest free index.
  def test_ttou_with_oldest_culling_stops_the_oldest_worker
    server = cluster("worker_culling_strategy :oldest\n")
    booted(server, 2)
    server.signal("TTOU")
    server.wait_for(/- Stopping worker 0 \(PID: \d+\)/)
    server.wait_for(/- Workers: 1/)
    assert_equal 200, get(server.port).status
    server.wait_for(/Worker 0 \(PID: \d+\) stopped/)
    server.signal("TTIN")
    server.wait_for(/- Workers: 2/)
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 2)
    refute_match(/Worker 2 /, server.stdout)
    assert_equal 200, get(server.port).status
  end

  def test_usr1_phased_restart_replaces_workers_one_at_a_time
    server = cluster
    old = booted(server, 2)
    server.signal("USR1")
    server.wait_for(/Phased restart to phase 1 \(preloaded: app code is not reloaded\)/)
    server.wait_for(/Worker 1 \(PID: \d+\) booted in [\d.]+s, phase: 1/)
    server.wait_for(/Worker 0 \(PID: \d+\) booted in [\d.]+s, phase: 1/)
    lines = server.stdout.lines
    first_stop = lines.index { |l| l.include?("- Stopping worker") }
    second_stop = lines.rindex { |l| l.include?("- Stopping worker") }
    first_new_boot = lines.index { |l| l.match?(/booted in .*phase: 1/) }
    assert_operator first_new_boot, :<, second_stop, "the second worker stopped before the first replacement booted"
    assert_operator first_stop, :<, first_new_boot
    fresh = server.stdout.scan(/PID: (\d+)\) booted in [\d.]+s, phase: 1/).flatten.map(&:to_i)
    assert_empty old & fresh
    assert_includes fresh, get(server.port).body.to_i
  end

  def test_usr2_hot_restart_keeps_the_master_pid_and_the_socket
    server = cluster
    old = booted(server, 2)
    server.signal("USR2")
    server.wait_for(/- Restarting: exec/)
    server.wait_for(/Adopted restart fd \d+ for tcp:\/\/127\.0\.0\.1:0/)
    booted(server, 4)
    fresh = server.stdout.scan(/PID: (\d+)\) booted/).flatten.map(&:to_i) - old
    assert_equal 2, fresh.size, server.logs
    assert_includes fresh, get(server.port).body.to_i
    assert_match(/cluster: \d\/2/, File.read("/proc/#{server.pid}/cmdline"))
  end

  def test_usr2_in_single_mode
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:2"], files: { "config.ru" => APP }).boot
    first = get(server.port).body.to_i
    assert_equal server.pid, first
    server.signal("USR2")
    server.wait_for(/Adopted restart fd/)
    server.wait_for_count(/Listening on/, 2)
    assert_equal server.pid, get(server.port).body.to_i
  end

  # Both modes share one stop (Supervisor#begin_stop): a restart asked for
  # while a stop is under way is ignored, not done after the drain.
  def test_usr2_during_a_graceful_stop_is_ignored
    server = cluster
    booted(server, 2)
    slow = Thread.new { get(server.port, "sleep=1") }
    server.wait_for(/app: sleeping 1/)
    server.signal("TERM")
    server.wait_for(/- Gracefully stopping/)
    server.signal("USR2")
    server.wait_for(/- Hot restart ignored: already stopping/)
    assert_equal 200, slow.value.status
    assert server.wait(10), server.logs
    assert server.status.success?, server.logs
    refute_includes server.stdout, "Restarting: exec"
  end

  # INT means "stop now", also during a hot restart's drain: the process
  # exits instead of exec'ing.
  def test_int_during_a_hot_restart_stops_instead
    server = cluster
    booted(server, 2)
    slow = request_in_the_app(server, 5)
    server.signal("USR2")
    server.wait_for(/- Gracefully stopping/)
    server.signal("INT")
    assert server.wait(10), server.logs
    assert server.status.success?, server.logs
    assert_includes server.stdout, "- Stopping now"
    refute_includes server.stdout, "Restarting: exec"
    slow.join(5)
  end

  def test_cluster_signals_in_single_mode_are_logged_and_ignored
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:1"], files: { "config.ru" => APP }).boot
    server.signal("USR1")
    server.wait_for(/- phased_restart needs cluster mode \(workers > 0\); ignored/)
    server.signal("TTIN")
    server.wait_for(/- add_worker needs cluster mode \(workers > 0\); ignored/)
    assert_equal server.pid, get(server.port).body.to_i
  end

  def test_hup_reopens_redirected_logs
    dir = Dir.mktmpdir("serval-hup-")
    log = File.join(dir, "out.log")
    cmd = ["sh", "-c", "exec #{RbConfig.ruby} -w #{Serval::SubprocessServer::EXE} -C c.rb > #{log} 2>&1"]
    config = "bind 'tcp://127.0.0.1:#{Serval::SubprocessServer.free_port}'\nworkers 2\n"
    server = spawn_server(command: cmd, files: { "config.ru" => APP, "c.rb" => config }).start
    deadline = Time.now + 10
    sleep 0.02 until (File.exist?(log) && File.read(log).scan("booted").size >= 2) || Time.now > deadline
    File.rename(log, "#{log}.1")
    server.signal("HUP")
    sleep 0.02 until (File.exist?(log) && File.read(log).include?("Reopened")) || Time.now > deadline + 5
    assert_includes File.read(log), "- Reopened #{log}"
  ensure
    server&.stop
    FileUtils.rm_rf(dir) if dir
  end

  def test_dump_signal_prints_every_thread_of_master_and_workers
    server = cluster
    booted(server, 2)
    server.signal(Serval::Signals::DUMP_SIGNAL)
    server.wait_for(/master \[\d+\] thread/, stream: :err)
    server.wait_for(/worker 0 \[\d+\] thread serval-worker/, stream: :err)
    server.wait_for(/worker 1 \[\d+\] thread/, stream: :err)
  end

  # A process the app forks inherits Serval's trap handlers. A TERM sent to
  # it used to write `stop` into the server's own signal pipe and stop the
  # server; it now ends that child, as Ruby's handler would have.
  def test_a_term_to_a_child_the_app_forked_ends_the_child_not_the_server
    app = <<~'RUBY'
      run lambda { |env|
        pid = fork { sleep 30; exit!(0) }
        Process.kill(:TERM, pid)
        _, status = Process.wait2(pid)
        [200, {"content-type" => "text/plain"}, ["child #{status.termsig}"]]
      }
    RUBY
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:1"], files: { "config.ru" => app }).boot
    assert_equal "child #{Signal.list['TERM']}", get(server.port).body
    assert_equal 200, get(server.port).status, "the server still serves"
    refute_match(/Gracefully stopping/, server.stdout)
  end

end
