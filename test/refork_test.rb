# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "support/subprocess_server"
require "support/http_wire"

# fork_worker (refork): a warmed worker becomes the mold, every worker is
# replaced by a fork of it (the master's child), with no failed request;
# the refork command; respawns from the mold; a mold that dies.
class ReforkTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  # The app remembers, in the process, the requests it saw: a fork of the
  # mold starts with the mold's count (the warmed heap), a fresh fork from
  # the master with 0.
  APP = <<~RUBY
    SEEN = [0]
    run lambda { |env|
      SEEN[0] += 1
      [200, {"content-type" => "text/plain"}, ["\#{Process.pid} \#{Process.ppid} \#{SEEN[0]}"]]
    }
  RUBY

  TOKEN = "refork-test"

  def cluster(extra, workers: 2)
    config = "bind 'tcp://127.0.0.1:0'\nthreads 2, 2\nworkers #{workers}\nworker_check_interval 0.2\n" \
             "control_url 'unix://ctl.sock'\ncontrol_auth_token '#{TOKEN}'\n" \
             "before_refork { |i| $stdout.puts \"before_refork \#{i} \#{Process.pid}\" }\n" \
             "after_refork { |i| $stdout.puts \"after_refork \#{i}\" }\n#{extra}\n"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => APP, "c.rb" => config }).boot
    server.wait_for(/Worker #{workers - 1} \(PID: \d+\) booted/)
    server
  end

  def test_after_requests_every_worker_is_a_fork_of_the_mold_without_failures
    server = cluster("fork_worker 30")
    master = server.pid
    load = Serval::HttpWire::LoadClient.new(server.port, threads: 3).start
    mold = server.wait_for(/Refork 1 \(worker 0 served \d+ requests >= 30\): worker 0 \(PID: (\d+)\) becomes the mold/,
                           timeout: 20)[1]
    server.wait_for(/Worker 0 \(PID: #{mold}\) is now the mold/, timeout: 20)
    server.wait_for(/Worker 1 \(PID: \d+\) replaced by a fork of the mold/, timeout: 20)
    server.wait_for_count(/Worker 1 \(PID: \d+\) stopped/, 1, timeout: 20)
    assert load.wait_for_more(100), "serving after the refork"
    result = load.stop
    assert_equal 0, result.failed, "failures: #{result.errors.inspect}\n#{server.logs}"

    pids = 20.times.map { get_body(server.port).split }
    assert(pids.all? { |_pid, ppid, _seen| ppid == master.to_s }, "every worker is the master's child: #{pids.inspect}")
    assert(pids.all? { |_pid, _ppid, seen| seen.to_i > 30 }, "forks of the warmed mold remember its requests: #{pids.inspect}")
    refute_includes pids.map(&:first), mold, "the mold serves nothing"
    assert_match(/before_refork 0 #{mold}/, server.stdout, "before_refork runs in the mold")
    assert_match(/after_refork 1/, server.stdout)

    stats = control_stats(server)
    assert_equal 1, stats["reforks"]
    assert_equal mold.to_i, stats.dig("mold", "pid")
    assert_equal [1, 1], stats["worker_status"].map { |w| w["generation"] }
  ensure
    load&.stop
  end

  def test_refork_command_and_a_crashed_worker_forks_from_the_mold
    server = reforked
    victim = worker_pid(server, 1)
    Process.kill(:KILL, victim)
    server.wait_for(/Worker 1 \(PID: #{victim}\) exited \(signal KILL\)/, stream: :err, timeout: 10)
    server.wait_for_count(/Worker 1 \(PID: \d+\) booted/, 3, timeout: 10)
    assert_equal [1, 1], control_stats(server)["worker_status"].map { |w| w["generation"] }, "respawned from the mold"
  end

  def test_when_the_mold_dies_the_master_forks_again
    server = reforked
    mold = control_stats(server).dig("mold", "pid")
    Process.kill(:KILL, mold)
    server.wait_for(/The mold \(PID: #{mold}\) exited \(signal KILL\)/, timeout: 10)
    victim = worker_pid(server, 0)
    Process.kill(:KILL, victim)
    server.wait_for(/Worker 0 \(PID: #{victim}\) exited/, stream: :err, timeout: 10)
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 3, timeout: 10)
    stats = control_stats(server)
    assert_nil stats["mold"]
    assert_equal 0, stats["worker_status"].find { |w| w["index"] == 0 }["generation"], "forked by the master"
    fresh = stats["worker_status"].find { |w| w["index"] == 0 }["pid"].to_s
    # Which worker the kernel hands a connection to is its choice: worker 1
    # is stopped while these are sent, so worker 0 takes every one of them.
    # kill(2) returns before the stop: a thread not yet stopped may still
    # take a connection, so the requests wait until every thread is stopped.
    other = worker_pid(server, 1)
    Process.kill(:STOP, other)
    begin
      wait_until_stopped(other)
      seen = 5.times.map { get_body(server.port).split }
    ensure
      Process.kill(:CONT, other)
    end
    assert_equal [fresh] * 5, seen.map(&:first), "worker 1 was stopped: worker 0 served all"
    assert_equal((1..5).to_a, seen.map(&:last).map(&:to_i), "a fresh fork from the master saw no request before")
  end

  def test_added_workers_fork_from_the_mold_and_a_phased_restart_ends_it
    server = reforked
    server.signal("TTIN")
    server.wait_for(/Worker 2 \(PID: \d+\) booted/, timeout: 10)
    assert_equal [1, 1, 1], control_stats(server)["worker_status"].map { |w| w["generation"] }, "TTIN forks from the mold"
    server.signal("USR1")
    server.wait_for(/The mold \(PID: \d+\) stopped/, timeout: 10)
    server.wait_for_count(/Worker 2 \(PID: \d+\) booted/, 2, timeout: 15) # the last one the phased restart replaces
    stats = control_stats(server)
    assert_nil stats["mold"]
    assert_equal [0, 0, 0], stats["worker_status"].map { |w| w["generation"] }, "phased restart: forked by the master"
  end

  def test_a_worker_that_does_not_become_the_mold_is_killed_and_replaced
    server = cluster("fork_worker 0\ndrain_timeout 1\nworker_boot_timeout 2")
    stuck = worker_pid(server, 0)
    Process.kill(:STOP, stuck)
    server.signal("URG")
    server.wait_for(/Worker 0 \(PID: #{stuck}\) did not become the mold within 3\.0s; killing it/, stream: :err, timeout: 10)
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 2, timeout: 10)
    stats = control_stats(server)
    assert_nil stats["mold"]
    assert_equal [0, 0], stats["worker_status"].map { |w| w["generation"] }
  ensure
    Process.kill(:CONT, stuck) rescue nil # rubocop:disable Style/RescueModifier
  end

  def test_stop_ends_the_mold_too
    server = cluster("fork_worker 0", workers: 1)
    server.signal("URG")
    mold = server.wait_for(/Worker 0 \(PID: (\d+)\) is now the mold/, timeout: 20)[1]
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 2, timeout: 20)
    server.signal("TERM")
    assert server.wait(20), "the master exits"
    assert_match(/The mold \(PID: #{mold}\) stopped/, server.stdout)
    assert_raises(Errno::ESRCH) { Process.kill(0, mold.to_i) }
  end

  def test_bad_values_and_single_mode
    assert_match(/fork_worker/, assert_raises(Serval::ConfigError) { config_from("fork_worker(-1)\n") }.message)
    assert_equal 1000, config_from("fork_worker\n")[:fork_worker]
    assert_nil config_from("fork_worker false\n")[:fork_worker]
  end

  private

  # fork_worker 0: no refork until the command (SIGURG); then both workers
  # are forks of the mold.
  def reforked
    server = cluster("fork_worker 0")
    3.times { get_body(server.port) }
    refute_match(/Refork/, server.stdout, "fork_worker 0: only on the command")
    server.signal("URG")
    server.wait_for(/Refork 1 \(refork command\): worker 0 \(PID: \d+\) becomes the mold/, timeout: 10)
    server.wait_for(/Worker 1 \(PID: \d+\) stopped/, timeout: 10)
    server
  end

  def wait_until_stopped(pid, timeout: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      states = Dir["/proc/#{pid}/task/*/stat"].map { |f| File.read(f)[/\) (\S)/, 1] }
      return if !states.empty? && states.all?("T")

      flunk "#{pid} not stopped within #{timeout}s (threads: #{states.join})" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      Thread.pass
    end
  end

  def worker_pid(server, index)
    control_stats(server)["worker_status"].find { |w| w["index"] == index }["pid"]
  end

  def get_body(port)
    response = http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_equal "200", response.status_line.split[1], response.raw
    response.body
  end

  def control_stats(server)
    server.wait_for(/\* Control app on unix:/)
    socket = UNIXSocket.new(File.join(server.dir, "ctl.sock"))
    socket.write("GET /stats?token=#{TOKEN} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    JSON.parse(socket.read.split("\r\n\r\n", 2).last)
  ensure
    socket&.close
  end
end
