# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"
require "json"

# cpu_fit (the process's CPU per 0.25 s step regressed on the step's
# requests, lib/serval/timing/window.rb) separates a fixed CPU a second from
# the cost of one more request. A window recorded at part load spreads the
# fixed part over fewer requests than a busy process does; where the fit is
# sound, the model charges a request what it costs at saturation,
# per_request / (1 - fixed) (Window#load_scale), and only then.
class AdviceLoadScaleTest < Minitest::Test
  SHAPE = [0.0005, 0.004, 0.0003, 0.004, 0.0005].freeze

  # A recorded-like window (the Rails example's figures, as in
  # cpu_scale_test.rb): 1.3 ms of run, outside_cpu and gvl_between as
  # measured, the charge about the process's 1.6 ms of CPU per request.
  def window(**extra)
    rng = Random.new(11)
    samples = Array.new(600) do
      run = 0.0013 * (0.5 + rng.rand)
      { run: run, idle: 0.008, stall: 0.0005, wall: run + 0.0085, shape: SHAPE.map { |v| v * run / 0.0013 } }
    end
    { requests: 15_000, seconds: 60.0, max_threads: 8, gvl_split: true, io_waits: 2, gvl_handoff: 0.000016,
      outside_cpu: 0.145, gvl_between: 0.10, cpu_per_request: 0.0016, samples: samples }.merge(extra)
  end

  # 250 req/s at 1.6 ms: 0.4 CPU a second, of which fixed 0.1 and 250 x 1.2 ms.
  FIT = { fixed: 0.1, per_request: 0.0012, se: 0.00002, steps: 240, busy_p90: 0.5 }.freeze

  def adv(hash) = Serval::Advice::Window.new(hash)
  def charged(w) = w.unscaled_workload.mean_run * (1 + w.gvl_between + w.outside_cpu) * w.cpu_scale

  def test_a_fixed_cpu_brings_the_charge_to_the_saturated_cost
    w = adv(window(cpu_fit: FIT))
    plain = adv(window)
    assert_in_delta 0.0012 / 0.9, w.saturated_cpu_per_request, 1e-12
    k = w.load_scale
    assert_in_delta (0.0012 / 0.9) / charged(w), k, 1e-12
    assert_operator k, :<, 0.9
    assert_in_delta plain.workload.mean_run * k, w.workload.mean_run, 1e-12
    assert_in_delta plain.workload.mean_io, w.workload.mean_io, 1e-12, "the waits stay as measured"
    assert_in_delta plain.workload.between * k, w.workload.between, 1e-12
  end

  # With cpu_scale: the further factor is from the charge cpu_scale left.
  def test_after_cpu_scale
    w = adv(window(cpu_per_request: 0.0014, cpu_fit: FIT))
    assert_operator w.cpu_scale, :<, 1.0
    assert_in_delta 0.0012 / 0.9, charged(w) * w.load_scale, 1e-12
    assert_in_delta adv(window(cpu_per_request: 0.0014)).workload.mean_run * w.load_scale, w.workload.mean_run, 1e-12
  end

  # A saturated process's steps (the 70 % synthetic window at 3 threads,
  # closed loop: busy_p90 high) read a large fixed CPU and a low cost per
  # request: not believed (bench/NOTES.md, session 22 railscpu).
  def test_no_change_without_a_sound_fit
    plain = adv(window)
    [nil, FIT.merge(fixed: 0.005), FIT.merge(fixed: -0.05), FIT.merge(fixed: 0.95), FIT.merge(se: 0.0002),
     FIT.merge(per_request: -0.001), FIT.merge(per_request: 0.0030), FIT.except(:se),
     FIT.merge(busy_p90: 0.85), FIT.except(:busy_p90)].each do |fit|
      w = adv(window(cpu_fit: fit))
      assert_equal 1.0, w.load_scale, fit.inspect
      assert_equal plain.workload.mean_run, w.workload.mean_run, fit.inspect
    end
    assert_equal 1.0, adv(window(cpu_fit: FIT).except(:cpu_per_request)).load_scale, "no cpu_per_request"
    ruby31 = window(cpu_fit: FIT, gvl_split: false)
    ruby31[:samples] = ruby31[:samples].map { |s| { cpu: s[:run], wall: s[:wall] } }
    assert_equal 1.0, adv(ruby31).load_scale, "Ruby 3.1: no sampler's steps"
  end

  def test_a_fit_claiming_too_much_is_held_at_the_floor
    w = adv(window(cpu_fit: FIT.merge(fixed: 0.8, per_request: 0.0001, se: 0.000001)))
    assert_equal Serval::Advice::Window::LOAD_SCALE_MIN, w.load_scale
  end

  def test_bad_figures_are_refused
    [{ fixed: "x", per_request: 0.001 }, { fixed: 0.1 }, { fixed: Float::INFINITY, per_request: 0.001 },
     { fixed: 0.1, per_request: 0.001, se: -1 }, { fixed: 0.1, per_request: Float::NAN }, [1, 2]].each do |bad|
      assert_raises(ArgumentError, bad.inspect) { adv(window(cpu_fit: bad)) }
    end
  end

  # The advice says so, with the factor and the fit, and its capacity rises by it.
  def test_the_advice_reports_the_factor
    opts = { sim_requests: 4000, precision: false }
    plain = Serval::Advice.recommend(window, **opts)
    scaled = Serval::Advice.recommend(window(cpu_fit: FIT), **opts)
    assert_nil plain[:workload][:load_scale]
    assert_nil plain[:workload][:cpu_fit]
    k = scaled[:workload][:load_scale]
    assert_operator k, :<, 0.9
    assert_in_delta 0.1, scaled[:workload][:cpu_fit][:fixed], 1e-12
    assert(scaled[:reasons].any? { |r| r.start_with?(format("run taken at a further %.2f", k)) }, scaled[:reasons].inspect)
    refute(plain[:reasons].any? { |r| r.start_with?("run taken at a further") })
    assert_operator scaled[:max_rps_per_process], :>, plain[:max_rps_per_process] * 1.1
  end

  # JSON (a saved window, `servalctl advise --from`): String keys work too.
  def test_string_keys
    w = adv(JSON.parse(JSON.generate(window(cpu_fit: FIT))))
    assert_in_delta adv(window(cpu_fit: FIT)).load_scale, w.load_scale, 1e-12
  end
end
