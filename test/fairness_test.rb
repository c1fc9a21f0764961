# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require_relative "support/subprocess_server"
require "serval/dsl"
require "serval/fairness"

# fair_timeslice (docs/tuning.md "Fairness between CPU- and I/O-bound
# requests"): the option's validation, that request threads get the shorter
# slice (and do not when off), and that an I/O-bound request makes progress
# beside a CPU-bound one. Its figures belong to `bench/run fairness`.
class FairnessTest < Minitest::Test
  include Serval::HttpWire
  include Serval::SubprocessHelpers

  def finish(value)
    Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(fair_timeslice: value))[:fair_timeslice]
  end

  def test_values_accepted
    assert_equal 0.0, Serval::Configuration::DEFAULTS[:fair_timeslice]
    assert_equal 2.0, Serval::Fairness::DEFAULT_SLICE_MS
    assert_equal 10.0, finish(10)
    assert_equal 2.5, finish("2.5")
    assert_equal 0.0, finish(false)
    assert_equal 0.0, finish(0)
    assert_equal 0.0, finish("off")
    assert_equal 2.0, finish(true)
  end

  def test_bad_values_name_the_option
    { "abc" => /expected milliseconds/, -1 => /must be 0 \(off\) or >= 1/, 0.5 => /must be 0 \(off\) or >= 1/,
      500 => /must be <= 100/, [] => /expected milliseconds/ }.each do |value, message|
      error = assert_raises(Serval::ConfigError, value.inspect) { finish(value) }
      assert_match(/\Afair_timeslice: /, error.message)
      assert_match message, error.message
    end
  end

  def test_dsl_and_flags
    options = {}
    dsl = Serval::DSL.new(options, ->(_) {})
    dsl.fair_timeslice false
    assert_equal 0.0, options[:fair_timeslice]
    dsl.fair_timeslice 20
    assert_equal 20.0, options[:fair_timeslice]
    assert_raises(Serval::ConfigError) { dsl.fair_timeslice "fast" }
  end

  def test_bad_flag_fails_at_boot_naming_the_option
    server = spawn_server(["--fair-timeslice", "fast", "-b", "tcp://127.0.0.1:0"]).start
    status = server.wait(15) or flunk("serval did not exit\n#{server.logs}")
    server.stop
    assert_equal 1, status.exitstatus
    assert_equal "serval: fair_timeslice: expected milliseconds (1.0..100.0) or false, got \"fast\"\n", server.stderr
  end

  # Ruby's slice is 100 ms >> -priority; the priority fallback picks the
  # highest priority whose slice is at most the setting, at least -3.
  def test_priority_for
    assert_equal(-3, Serval::Fairness.priority_for(1))
    assert_equal(-3, Serval::Fairness.priority_for(12.5))
    assert_equal(-2, Serval::Fairness.priority_for(25))
    assert_equal(-1, Serval::Fairness.priority_for(50))
    assert_equal(0, Serval::Fairness.priority_for(100))
  end

  # What a request thread sees of itself.
  THREAD_APP = lambda do |_env|
    t = Thread.current
    marked = Serval::Native::Fairness.supported? && Serval::Native::Fairness.marked?(t)
    [200, { "content-type" => "text/plain" }, ["#{Serval::Fairness.applied?(t)} #{t.priority} #{marked}"]]
  end

  def request_thread_state(fair_timeslice)
    with_server(THREAD_APP, fair_timeslice: fair_timeslice, min_threads: 2, max_threads: 2) do |_server, port|
      http(port, get("/", { "Connection" => "close" })).body
    end
  end

  def test_request_threads_get_the_slice
    applied, priority, marked = request_thread_state(5.0).split
    assert_equal "true", applied
    if Serval::Fairness.supported?
      assert_equal "true", marked, "preempted by the native ticker (Ruby 3.3+)"
      assert_equal "0", priority
    else
      assert_equal "-3", priority, "Thread#priority fallback (Ruby < 3.3)"
    end
  end

  # The slice the server ran with reaches its window, so the advice models
  # the GVL as the server shares it.
  def test_the_window_carries_the_effective_slice
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    with_server(app, fair_timeslice: 5.0, timing: true) do |server, _port|
      expected = Serval::Fairness.supported? ? 0.005 : 0.0125 # priority -3: 100 ms / 8
      assert_in_delta expected, server.window[:timeslice], 1e-9
    end
    with_server(app, fair_timeslice: 0.0, timing: true) do |server, _port|
      refute server.window.key?(:timeslice)
    end
  end

  def test_request_threads_untouched_when_off
    assert_equal "false 0 false", request_thread_state(0.0)
  end

  def test_native_ticker_runs_only_when_on
    skip "no native preemption on Ruby #{RUBY_VERSION}" unless Serval::Fairness.supported?

    with_server(->(_env) { [200, {}, ["ok"]] }, fair_timeslice: 5.0) do
      assert Serval::Native::Fairness.running?
      assert_equal :preempt, Serval::Fairness.mode
    end
    refute Serval::Native::Fairness.running?, "stopped with the server"
    with_server(->(_env) { [200, {}, ["ok"]] }, fair_timeslice: 0.0) do
      refute Serval::Native::Fairness.running?
      assert_equal :off, Serval::Fairness.mode
    end
  end

  # /cpu computes (never blocking) until the test says stop; /io makes
  # IO_STEPS short blocking calls. Beside /cpu, /io waits for the GVL after
  # each call: up to Ruby's 100 ms slice without fairness (>= 3 s for the
  # whole request), about the 5 ms slice with it (~0.3 s).
  IO_STEPS = 30
  IO_BOUND = 1.5 # seconds: generous against ~0.3 s, half of what 30 x 100 ms slices take

  def fairness_app(started, stop)
    lambda do |env|
      if env["PATH_INFO"] == "/cpu"
        started << true
        n = 0
        n += 1 while stop.empty?
        [200, { "content-type" => "text/plain" }, [n.to_s]]
      else
        IO_STEPS.times { sleep 0.002 }
        [200, { "content-type" => "text/plain" }, ["io"]]
      end
    end
  end

  def test_io_request_progresses_beside_a_cpu_bound_one
    skip "Ruby #{RUBY_VERSION}: only the Thread#priority fallback (docs/tuning.md)" unless Serval::Fairness.supported?

    started = Queue.new
    stop = Queue.new
    with_server(fairness_app(started, stop), fair_timeslice: 5.0, min_threads: 2, max_threads: 2) do |_server, port|
      before = Serval::Native::Fairness.stats[:preemptions]
      cpu = Thread.new { http(port, get("/cpu", { "Connection" => "close" }), timeout: 15) }
      started.pop
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      res = http(port, get("/io", { "Connection" => "close" }), timeout: 15)
      took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      stop << true
      assert_equal 200, res.status
      assert_equal 200, cpu.value.status
      assert_operator Serval::Native::Fairness.stats[:preemptions] - before, :>=, IO_STEPS / 2,
                      "the CPU-bound thread gave the GVL away"
      assert_operator took, :<, IO_BOUND, "the I/O-bound request progressed beside the CPU-bound one"
    ensure
      stop << true
    end
  end
end
