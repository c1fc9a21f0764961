# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "rack/lint"
require "rack/mock"
require "support/advice_windows"
require "serval/control_app"
require "serval/advice"

# /advice: the recommendation from the launcher's measurement window, as
# JSON, with the contract `servalctl advise --json` prints.
class AdviceControlTest < Minitest::Test
  TOKEN = "t0ken"

  # Stands in for Serval::Launcher (with the measurement window).
  class WindowLauncher
    attr_accessor :window

    def initialize(window) = @window = window
    def stats = { started_at: "2026-01-01T00:00:00Z", max_threads: 3, requests_count: 1 }
  end

  # A launcher from before the measurement window.
  class OldLauncher
    def stats = {}
  end

  def get(launcher, query = "")
    # the model as long as it takes (on a loaded machine, past ControlApp::ADVICE_WAIT)
    app = Rack::Lint.new(Serval::ControlApp.new(launcher, token: TOKEN, advice_wait: 600))
    res = Rack::MockRequest.new(app).get("/advice?token=#{TOKEN}#{query}")
    [res.status, JSON.parse(res.body)]
  end

  def test_json_contract
    status, body = get(WindowLauncher.new(AdviceWindows.window(1500)))
    assert_equal 200, status
    assert_kind_of Integer, body["threads"]
    assert_operator body["threads"], :>=, 1
    assert_kind_of Integer, body["processes"]
    assert_operator body["processes"], :>=, 1
    assert_kind_of Float, body["cpu_share"]
    assert_includes 0.0..1.0, body["cpu_share"]
    assert_in_delta 0.35, body["cpu_share"], 0.05
    assert_kind_of Float, body["max_rps_per_process"]
    assert_operator body["max_rps_per_process"], :>, 0
    assert_equal 1500, body["requests"]
    assert_kind_of Array, body["warnings"]
    body["warnings"].each { |w| assert_kind_of String, w }
    assert body["enough_data"]
    assert_includes Serval::Advice::Sweep::MIN_ROWS..16, body["sweep"].size # it may stop past the knee
    assert_match(/\Aadvice: \d+ threads(?: \(\d+-\d+\))? x \d+ processes \(cpu share 0\.\d\d from 1,500 requests/, body["summary"])
    assert body["machine"]["cpus"], "this machine's CPUs are in the answer"
    refute(body["warnings"].any? { |w| w.include?("computed in the server process") }, "the model ran in a child process")
  end

  def test_too_little_data_says_how_many
    status, body = get(WindowLauncher.new(AdviceWindows.window(40)))
    assert_equal 200, status
    refute body["enough_data"]
    assert_nil body["threads"]
    assert_nil body["max_rps_per_process"]
    assert_equal 40, body["requests"]
    assert_equal "40 requests measured, need 300", body["warnings"].first
  end

  def test_fleet_options_reach_the_recommender
    status, body = get(WindowLauncher.new(AdviceWindows.window(1200)),
                       "&machines=3&extra_connections=20&db_max_connections=30&target_rps=400")
    assert_equal 200, status
    db = body["database"]
    assert_equal 3, db["machines"]
    assert_equal 20, db["extra"]
    assert_equal 30, db["max_connections"]
    assert_equal (3 * db["per_machine"]) + 20, db["fleet"]
    assert_equal 400.0, body["capacity"]["target_rps"]
    assert_operator body["capacity"]["machines"] * body["capacity"]["processes"] * body["max_rps_per_process"], :>=, 400
  end

  def test_bad_parameters_are_refused
    launcher = WindowLauncher.new(AdviceWindows.window(1200))
    ["&machines=0", "&machines=two", "&target_rps=-5", "&target_rps=Infinity", "&extra_connections=-1",
     "&db_max_connections=1.5"].each do |q|
      status, body = get(launcher, q)
      assert_equal 400, status, q
      assert_match(/target_rps/, body["error"])
    end
  end

  def test_missing_workers_are_named
    win = AdviceWindows.window(1200, processes: 2, missing: [{ index: 1, pid: 4242, error: "timeout" }])
    _, body = get(WindowLauncher.new(win))
    assert(body["warnings"].any? { |w| w.include?("no window from worker 1") }, body["warnings"].inspect)
  end

  def test_without_a_window_in_the_build
    status, body = get(OldLauncher.new)
    assert_equal 501, status
    assert_equal "no measurement window in this build", body["error"]
  end

  def test_no_window_yet
    status, body = get(WindowLauncher.new(nil))
    assert_equal 503, status
    assert_match(/no measurement window yet/, body["error"])
  end

  # ControlApp#prepare_advice (Control runs it when the control app
  # starts): the model's child is up before the first /advice.
  def test_the_models_child_starts_before_the_first_ask
    app = Serval::ControlApp.new(WindowLauncher.new(nil), token: TOKEN)
    app.prepare_advice
    child = app.send(:model_process)
    refute_nil child.pid
    assert_equal :batch, child.priority
    assert_equal 1, Process.kill(0, child.pid)
  ensure
    child&.stop
  end

  def test_no_child_ahead_when_timing_is_off_or_a_runner_is_given
    off = WindowLauncher.new(nil)
    off.define_singleton_method(:options) { { timing: false } }
    app = Serval::ControlApp.new(off, token: TOKEN)
    app.prepare_advice
    assert_nil app.instance_variable_get(:@model_process)
    runner = Object.new
    given = Serval::ControlApp.new(WindowLauncher.new(nil), token: TOKEN, runner: runner)
    given.prepare_advice
    assert_nil given.instance_variable_get(:@model_process)
    old = Serval::ControlApp.new(OldLauncher.new, token: TOKEN)
    old.prepare_advice
    assert_nil old.instance_variable_get(:@model_process)
  end

  def test_needs_the_token
    app = Rack::Lint.new(Serval::ControlApp.new(WindowLauncher.new(AdviceWindows.window(10)), token: TOKEN))
    assert_equal 403, Rack::MockRequest.new(app).get("/advice?token=nope").status
  end
end
