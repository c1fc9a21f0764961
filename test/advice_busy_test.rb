# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "stringio"
require "tmpdir"
require "rack/lint"
require "rack/mock"
require "support/advice_windows"
require "serval/control_app"
require "serval/control"
require "serval/ctl"

# /advice while its model computes: the control app keeps answering
# status/stats, a request that waits too long gets 503 busy (Retry-After)
# and the result later, and servalctl tells busy (exit 4) from down (3).
class AdviceBusyTest < Minitest::Test
  TOKEN = "t0ken"

  # A model that computes until the test releases it.
  class SlowRunner
    attr_reader :entered, :calls

    def initialize
      @entered = Queue.new
      @release = Queue.new
      @calls = 0
    end

    def release = @release << true

    def advice(window, **_options)
      @calls += 1
      @entered << window[:requests]
      @release.pop
      { requests: window[:requests], threads: 3, enough_data: true, warnings: [], reasons: [], summary: "advice: slow" }
    end
  end

  class WindowLauncher
    attr_accessor :window

    def initialize(window) = @window = window
    def stats = { started_at: "2026-01-01T00:00:00Z", max_threads: 3, requests_count: 1 }
    def wait_until_booted(_timeout) = true
  end

  def setup
    @runner = SlowRunner.new
    @launcher = WindowLauncher.new(AdviceWindows.window(50))
  end

  def teardown
    @runner.release # never leave the model thread blocked
  end

  def call(app, path)
    res = Rack::MockRequest.new(app).get("#{path}?token=#{TOKEN}")
    [res.status, res.headers, JSON.parse(res.body)]
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def test_a_request_waits_then_busy_then_the_result_once_computed_and_cached
    inner = Serval::ControlApp.new(@launcher, token: TOKEN, runner: @runner, advice_wait: 0.05)
    app = Rack::Lint.new(inner)
    status, headers, body = call(app, "/advice")
    assert_equal 503, status
    assert_equal "1", headers["retry-after"]
    assert_equal true, body["busy"]
    assert_match(/busy: advice is being computed/, body["error"])
    assert_equal 50, @runner.entered.pop
    @runner.release
    status = nil
    50.times do # each waits up to 0.05 s for the job thread to store its result
      status, _, body = call(app, "/advice")
      break if status == 200
    end
    assert_equal 200, status
    assert_equal "advice: slow", body["summary"]
    assert_equal 1, @runner.calls
    status, _, body = call(app, "/advice") # same window: from the last result, no model run
    assert_equal 200, status
    assert_equal 3, body["threads"]
    assert_equal 1, @runner.calls
    # a new window with a job for other options running: busy at once
    @launcher.window = AdviceWindows.window(60)
    status, = Rack::MockRequest.new(app).get("/advice?token=#{TOKEN}&machines=2").then { |r| [r.status] }
    assert_equal 503, status
    assert_equal 60, @runner.entered.pop
    status, _, body = call(app, "/advice")
    assert_equal 503, status
    assert_match(/other options/, body["error"])
  end

  def test_wait_parameter
    app = Rack::Lint.new(Serval::ControlApp.new(@launcher, token: TOKEN, runner: @runner))
    started = now
    res = Rack::MockRequest.new(app).get("/advice?token=#{TOKEN}&wait=0")
    assert_equal 503, res.status
    assert_operator now - started, :<, 5 # not ADVICE_WAIT (10 s)
    %w[-1 x nan 1e9].each do |bad|
      res = Rack::MockRequest.new(app).get("/advice?token=#{TOKEN}&wait=#{bad}")
      assert_equal 400, res.status, bad
    end
  end

  def test_one_waiter_at_a_time_and_other_options_are_busy
    app = Rack::Lint.new(Serval::ControlApp.new(@launcher, token: TOKEN, runner: @runner, advice_wait: 30))
    waiter = Thread.new { call(app, "/advice") }
    @runner.entered.pop
    Thread.pass until waiter.stop? || !waiter.alive? # the waiter is in its join
    status, headers, body = call(app, "/advice")
    assert_equal 503, status
    assert_equal "1", headers["retry-after"]
    assert_match(/another request is waiting/, body["error"])
    @runner.release
    status, = waiter.value
    assert_equal 200, status
  ensure
    @runner.release
    waiter&.join(5)
  end

  def test_model_failure_is_a_500_and_the_next_request_computes_again
    failing = Object.new
    failing.define_singleton_method(:advice) { |*| raise ArgumentError, "broken window" }
    app = Rack::Lint.new(Serval::ControlApp.new(@launcher, token: TOKEN, runner: failing, advice_wait: 5))
    status, _, body = call(app, "/advice")
    assert_equal 500, status
    assert_match(/broken window/, body["error"])
    status, = call(app, "/advice")
    assert_equal 500, status
  end

  def unix_get(path, sock)
    s = UNIXSocket.new(sock)
    s.write("GET #{path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    s.wait_readable(10)
    s.read
  ensure
    s&.close
  end

  def served
    Dir.mktmpdir do |dir|
      log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
      options = Serval::Configuration::DEFAULTS.merge(control_url: "unix://#{dir}/ctl.sock", control_auth_token: TOKEN)
      control = Serval::Control.new(@launcher, options, log, advice_runner: @runner).start
      begin
        yield "#{dir}/ctl.sock"
      ensure
        @runner.release
        control.stop
      end
    end
  end

  # The served control app (two threads): while one request waits for the
  # model, which is still blocked, stats answers.
  def test_stats_answer_while_advice_computes
    served do |sock|
      waiter = Thread.new { unix_get("/advice?token=#{TOKEN}", sock) }
      @runner.entered.pop
      started = now
      assert_match(%r{\AHTTP/1\.1 200 .*"requests_count":1}m, unix_get("/stats?token=#{TOKEN}", sock))
      elapsed = now - started
      assert_operator elapsed, :<, 2.0 # 100 ms when idle; generous for a loaded CI machine
      assert_equal 0, @runner.entered.size
      assert waiter.alive?, "the model was released before stats answered"
      @runner.release
      assert_match(%r{\AHTTP/1\.1 200 .*"summary":"advice: slow"}m, waiter.value)
    end
  end

  def ctl(*args)
    out = StringIO.new
    err = StringIO.new
    code = Serval::Ctl.new(args, stdout: out, stderr: err, env: {}).run
    [code, out.string, err.string]
  end

  def test_servalctl_exit_codes_busy_and_down
    served do |sock|
      code, _, err = ctl("-C", "unix://#{sock}", "-T", TOKEN, "--wait", "0", "advise") # the server waits 10 s first
      assert_equal Serval::Ctl::EXIT_BUSY, code, err
      assert_match(/up but still computing/, err)
      @runner.release
      code, out, err = ctl("-C", "unix://#{sock}", "-T", TOKEN, "--wait", "30", "--json", "advise")
      assert_equal 0, code, err
      assert_equal "advice: slow", JSON.parse(out)["summary"]
    end
    Dir.mktmpdir do |dir|
      code, _, err = ctl("-C", "unix://#{dir}/none.sock", "-T", TOKEN, "advise")
      assert_equal 3, code
      assert_match(/cannot reach/, err)
    end
    code, _, err = ctl("-C", "unix:///x.sock", "-T", TOKEN, "--wait", "-1", "advise")
    assert_equal 2, code
    assert_match(/--wait/, err)
  end
end
