# frozen_string_literal: true

require "test_helper"
require "support/http_wire"
require "serval/prometheus"

# threads :auto in a running server: under load that queues on one thread
# while the GVL idles, the tuner raises the pool's size, logs why, and shows
# it in stats and /metrics. The interval is short for the test; the waits
# poll the stats against a deadline.
class AutoThreadsTest < Minitest::Test
  include Serval::HttpWire

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def test_the_pool_grows_under_io_bound_load
    app = lambda do |_env|
      sleep 0.005 # I/O-like: the GVL is free while it waits
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    out = StringIO.new
    log = Serval::LogWriter.new(stdout: out, stderr: StringIO.new)
    with_server(app, log_writer: log, min_threads: 0, max_threads: 1, threads_auto: true, threads_auto_max: 8,
                     auto_interval: 0.5) do |server, port|
      assert_equal 1, server.stats[:max_threads]
      assert_equal 1, server.stats[:auto][:target_threads]
      stop = false
      clients = Array.new(8) do
        Thread.new do
          until stop
            c = connect(port, timeout: 10)
            c.write(get("/", { "Connection" => "close" }))
            c.read_response
            c.close
          end
        end
      end
      deadline = now + 15
      sleep 0.05 until server.stats[:max_threads] >= 3 || now > deadline
      stop = true
      clients.each(&:join)
      stats = server.stats
      assert_operator stats[:max_threads], :>=, 3, "the pool did not grow: #{stats[:auto].inspect}\n#{out.string}"
      assert_equal stats[:max_threads], stats[:auto][:target_threads]
      assert_operator stats[:auto][:changes], :>=, 1
      assert_kind_of String, stats[:auto][:changed_at]
      assert_match(/queue p90 \d+ ms/, stats[:auto][:reason])
      assert_match(/queue p90 \d+ ms/, stats[:auto][:change_reason])
      assert_match(/threads: 1 -> [2-8] \(.*queue p90 \d+ ms, gvl \d+ %(, stall p95 \d+ ms)?, \d+ req\/s\)/, out.string) # no stall on Ruby 3.1
      assert_operator stats[:auto][:target_threads], :<=, 8

      metrics = Serval::Prometheus.render(stats)
      assert_match(/^serval_threads_target #{stats[:auto][:target_threads]}$/, metrics)
      assert_match(/^serval_threads_auto_info\{reason=".*queue p90.*"\} 1$/, metrics)
      assert_match(/^serval_threads_auto_changes_total \d+$/, metrics)
    end
  end

  # `-t auto` over a file's `threads 5, 5`: 5 threads start, but auto's
  # floor is 1 (no minimum was given with auto), and a decision below 5 is
  # applied: the pool then runs at most that many requests at once.
  def test_a_decision_below_a_minimum_not_given_with_auto_is_applied
    gate = Queue.new
    entered = Queue.new
    app = lambda do |_env|
      entered << true
      gate.pop
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(app, min_threads: 5, max_threads: 5, threads_auto: true, threads_auto_max: 8,
                     auto_interval: 60) do |server, port|
      tuner = server.part(:threads_auto)
      assert_equal [1, 8], [tuner.controller.min, tuner.controller.max]
      tuner.send(:apply, Serval::Auto::Decision.new(target: 2, from: 5, changed: true, reason: "test"))
      assert_equal [2, 2], server.stats.values_at(:min_threads, :max_threads)
      deadline = now + 10
      sleep 0.05 until server.stats[:running] <= 2 || now > deadline # the surplus threads leave after their wait
      clients = Array.new(4) do
        Thread.new do
          c = connect(port, timeout: 10)
          c.write(get("/", { "Connection" => "close" }))
          c.read_response.tap { c.close }
        end
      end
      2.times { entered.pop }
      deadline = now + 10
      sleep 0.02 until server.stats[:backlog] >= 2 || now > deadline # with 5 threads all four would run
      assert_equal [2, 2], server.stats.values_at(:busy_threads, :backlog)
      4.times { gate << true }
      2.times { entered.pop }
      clients.each { |t| assert_equal 200, t.value.status }
      assert_operator server.stats[:running], :<=, 2
    end
  end

  def test_without_auto_there_is_no_tuner
    with_server(->(_env) { [200, {}, ["ok"]] }, max_threads: 2) do |server, _port|
      assert_nil server.stats[:auto]
      refute(Thread.list.any? { |t| t.name == "serval-auto" })
    end
  end
end
