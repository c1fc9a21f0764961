# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "serval/timing"

# The window's figures against known workloads (Ruby 3.2+, the GVL hook):
# one thread alone must show (almost) no stall, two CPU-bound threads must,
# and a thread of the app's own that spins outside requests must not make
# requests' run longer while its GVL use shows in its own counter.
class WindowAccuracyTest < Minitest::Test
  include Serval::HttpWire

  def setup
    return if Serval::Native::GVL.supported?

    skip "Ruby #{RUBY_VERSION} has no GVL event hook (needs 3.2+): run, idle and stall are not split"
  end

  def self.spin(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    x
  end

  CPU_APP = lambda do |_env|
    spin(0.002)
    [200, { "content-type" => "text/plain" }, ["ok"]]
  end

  # CPU, a short wait, CPU: a thread back from the wait needs the GVL again,
  # and another thread may hold it (a request shorter than the 100 ms time
  # slice is not preempted: its threads would wait before the request starts).
  SPLIT_APP = lambda do |_env|
    spin(0.002)
    sleep 0.0005
    spin(0.002)
    [200, { "content-type" => "text/plain" }, ["ok"]]
  end

  # n requests back to back on one keep-alive connection.
  def loop_requests(port, n)
    client = connect(port, timeout: 10)
    n.times do
      client.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
      assert_equal 200, client.read_response.status
    end
  ensure
    client&.close
  end

  def share(window, figure)
    h = window[:histograms]
    h[figure][:sum] / h[:wall][:sum]
  end

  def test_one_thread_under_load_shows_no_stall
    with_server(CPU_APP, max_threads: 1) do |server, port|
      loop_requests(port, 200)
      w = server.window
      assert_equal 200, w[:requests]
      assert_operator share(w, :stall), :<, 0.01, "stall / wall of one thread alone"
      assert_operator share(w, :run), :>, 0.5, "the requests ran on the CPU"
    end
  end

  def test_two_cpu_bound_threads_stall
    with_server(SPLIT_APP, max_threads: 2) do |server, port|
      2.times.map { Thread.new { loop_requests(port, 100) } }.each(&:join)
      w = server.window
      assert_equal 200, w[:requests]
      assert_operator share(w, :stall), :>, 0.05, "two threads share one GVL"
      # the GVL passed between the two waiting threads: some handoffs, each
      # a wake-up (microseconds, never the 2 ms of a request's CPU)
      assert_operator w[:gvl_handoffs], :>, 10
      assert_operator w[:gvl_handoff], :>, 0
      assert_operator w[:gvl_handoff], :<, 0.002
    end
  end

  # CPU 2 ms, a 30 ms wait, CPU 2 ms, a 3 ms wait, CPU 2 ms: the sample's
  # shape has five spans, the long wait before the short one (one thread:
  # no stall to hide them; CPU spans are at least their CPU time however
  # busy the machine is, sleeps at least their length).
  SHAPE_APP = lambda do |_env|
    spin(0.002)
    sleep 0.03
    spin(0.002)
    sleep 0.003
    spin(0.002)
    [200, { "content-type" => "text/plain" }, ["ok"]]
  end

  def test_a_sample_carries_the_requests_shape
    # fairness off: the client threads of this process wait for the GVL, and
    # a preemption at the fair slice would cut a 2 ms spin into two spans
    with_server(SHAPE_APP, max_threads: 1, fair_timeslice: 0.0) do |server, port|
      loop_requests(port, 20)
      samples = server.window[:samples]
      assert_equal 20, samples.size
      samples.each do |s|
        shape = s.fetch(:shape)
        assert_equal 5, shape.size, "held, idle, held, idle, held: #{shape.inspect}"
        assert_in_delta s[:run], shape[0] + shape[2] + shape[4], 1e-4, "the held spans add up to run"
        assert_in_delta s[:idle], shape[1] + shape[3], 1e-4, "the idle spans add up to idle"
        [0, 2, 4].each { |i| assert_operator shape[i], :>=, 0.0018, "span #{i}: 2 ms of CPU" }
        assert_operator shape[1], :>=, 0.029, "the 30 ms sleep"
        assert_operator shape[3], :>=, 0.0029, "the 3 ms sleep"
        assert_operator shape[1], :>, shape[3], "in that order"
      end
    end
  end

  # An app thread spins on the CPU (outside any request) while requests run
  # 2 x 2 ms of CPU: their run stays about 4 ms (the spinner's time is their
  # stall, not their run), and the spinner's GVL shows as held outside requests.
  def test_a_thread_outside_requests_is_visible_but_not_in_request_run
    with_server(SPLIT_APP, max_threads: 1) do |server, port|
      refute_includes server.window[:histograms].keys, :pool_wait, "no Active Record: no pool_wait"
      recorder = server.instance_variable_get(:@handler).timing
      before = recorder.stats["gvl_outside_requests_seconds_total"][:value]
      stop = false
      spun = Queue.new
      spinner = Thread.new do
        t0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
        self.class.spin(0.001) until stop
        spun << (Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - t0)
      end
      loop_requests(port, 10)
      stop = true
      spinner.join
      cpu = spun.pop
      w = server.window
      outside = recorder.stats["gvl_outside_requests_seconds_total"][:value] - before
      mean_run = w[:histograms][:run][:sum] / w[:requests]
      # The spinner keeps the GVL for a 100 ms time slice at a time: filed as
      # the requests' run it would make their mean run tens of ms.
      assert_operator mean_run, :<, 0.03, "a request's run is its own 4 ms, not the spinner's"
      assert_operator share(w, :stall), :>, 0.1, "the spinner holds the GVL the requests wait for"
      assert_operator outside, :>=, cpu * 0.8, "the spinner's GVL time (#{cpu.round(3)} s CPU) is visible"
    end
  end

  # A fairness preemption gives the GVL away and wants it back at once: the
  # hook counts that as stall, not idle, so two requests that only compute,
  # preempted every 2 ms while the other waits, show no idle time and one
  # held span each.
  SPIN_APP = lambda do |_env|
    spin(0.02)
    [200, { "content-type" => "text/plain" }, ["ok"]]
  end

  def test_a_fairness_preemption_is_stall_not_idle
    skip "no native preemption on Ruby #{RUBY_VERSION}" unless Serval::Native::Fairness.supported?

    with_server(SPIN_APP, max_threads: 2, fair_timeslice: 2.0) do |server, port|
      before = Serval::Native::Fairness.stats[:preemptions]
      Array.new(2) { Thread.new { loop_requests(port, 5) } }.each(&:join)
      assert_operator Serval::Native::Fairness.stats[:preemptions] - before, :>, 5, "the requests were preempted"
      samples = server.window[:samples]
      assert_equal 10, samples.size
      samples.each do |s|
        assert_operator s[:idle], :<, 0.001, "no idle time in a request that only computes: #{s.inspect}"
        assert_equal 1, s.fetch(:shape).size, "one held span: #{s.inspect}"
      end
      assert_operator samples.sum { |s| s[:stall] }, :>, 0.02, "the preempted turns are stall"
    end
  end
end
