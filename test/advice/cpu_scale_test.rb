# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# cpu_per_request (the whole process's CPU per request over the window,
# lib/serval/timing/window.rb) caps the GVL time the model charges a
# request: run + gvl_between x run + outside_cpu x run. Where the charge
# exceeds it, run (and with it the other two) is taken at the factor that
# brings it down (Window#cpu_scale); where it does not, nothing changes.
class AdviceCpuScaleTest < Minitest::Test
  SHAPE = [0.0005, 0.004, 0.0003, 0.004, 0.0005].freeze

  # A recorded-like window: 1.33 ms of run and 8 ms of idle per request in
  # three held spans, 8 threads, 500 req/s, the GVL figures of the Rails
  # example (bench/NOTES.md, session 21).
  def window(**extra)
    rng = Random.new(11)
    samples = Array.new(600) do
      run = 0.00133 * (0.5 + rng.rand)
      { run: run, idle: 0.008, stall: 0.0005, wall: run + 0.0085, shape: SHAPE.map { |v| v * run / 0.0013 } }
    end
    { requests: 30_000, seconds: 60.0, max_threads: 8, gvl_split: true, io_waits: 2, gvl_handoff: 0.000016,
      outside_cpu: 0.145, gvl_between: 0.10, samples: samples }.merge(extra)
  end

  def charged(w) = w.unscaled_workload.mean_run * (1 + w.gvl_between + w.outside_cpu)

  def test_a_charge_above_the_process_cpu_is_brought_down_to_it
    w = Serval::Advice::Window.new(window(cpu_per_request: 0.0013))
    plain = Serval::Advice::Window.new(window)
    k = w.cpu_scale
    assert_operator k, :<, 1.0
    assert_in_delta 0.0013, charged(w) * k, 1e-12
    scaled = w.workload
    base = plain.workload
    assert_in_delta base.mean_run * k, scaled.mean_run, 1e-12
    assert_in_delta base.mean_io, scaled.mean_io, 1e-12, "the waits stay as measured"
    assert_in_delta base.between * k, scaled.between, 1e-12
    assert_in_delta (0.145 * base.mean_run * k) - (0.000016 * scaled.mean_segments), scaled.tail_cpu, 1e-12
    charge = scaled.mean_run + scaled.between + (0.145 * scaled.mean_run)
    assert_in_delta 0.0013, charge, 1e-9, "run + between + outside = the measured CPU"
    held = scaled.profiles(50, Random.new(3)).map { |p| p.each_slice(2).sum(&:first) }.sum / 50
    assert_in_delta k * base.profiles(50, Random.new(3)).map { |p| p.each_slice(2).sum(&:first) }.sum / 50, held, 1e-12,
                    "the measured shapes' held spans scale too"
  end

  def test_no_change_when_the_charge_is_within_the_process_cpu
    plain = Serval::Advice::Window.new(window)
    [charged(plain), charged(plain) * 1.5].each do |cpu|
      w = Serval::Advice::Window.new(window(cpu_per_request: cpu))
      assert_equal 1.0, w.cpu_scale
      assert_equal plain.workload.mean_run, w.workload.mean_run
      assert_equal plain.workload.profiles(20, Random.new(5)), w.workload.profiles(20, Random.new(5))
    end
  end

  def test_no_change_without_the_figures
    assert_equal 1.0, Serval::Advice::Window.new(window).cpu_scale, "no cpu_per_request (an older server)"
    no_outside = window(cpu_per_request: 0.0005).except(:outside_cpu)
    assert_equal 1.0, Serval::Advice::Window.new(no_outside).cpu_scale, "no outside_cpu: no sampler's steps"
    ruby31 = window(cpu_per_request: 0.0005, gvl_split: false)
    ruby31[:samples] = ruby31[:samples].map { |s| { cpu: s[:run], wall: s[:wall] } }
    assert_equal 1.0, Serval::Advice::Window.new(ruby31).cpu_scale, "Ruby 3.1: run is the CPU already"
  end

  def test_bad_figures_are_refused
    [-0.001, Float::INFINITY, "x"].each do |bad|
      assert_raises(ArgumentError, bad.inspect) { Serval::Advice::Window.new(window(cpu_per_request: bad)) }
    end
  end

  # A quiet window whose requests the sampler's 10 ms ticks never caught: 0 is unknown, no cap.
  def test_a_zero_figure_is_unknown
    w = Serval::Advice::Window.new(window(cpu_per_request: 0))
    assert_nil w.cpu_per_request
    assert_equal 1.0, w.cpu_scale
  end

  # The advice says so, with the factor, and its capacity rises by it.
  def test_the_advice_reports_the_factor
    opts = { sim_requests: 4000, precision: false }
    plain = Serval::Advice.recommend(window, **opts)
    within = Serval::Advice.recommend(window(cpu_per_request: 0.0030), **opts)
    scaled = Serval::Advice.recommend(window(cpu_per_request: 0.0013), **opts)
    assert_nil plain[:workload][:cpu_scale]
    assert_nil within[:workload][:cpu_scale]
    assert_in_delta 0.003, within[:workload][:cpu_per_request], 1e-12
    assert_equal plain[:max_rps_per_process], within[:max_rps_per_process]
    k = scaled[:workload][:cpu_scale]
    assert_operator k, :<, 0.9
    assert(scaled[:reasons].any? { |r| r.start_with?(format("run taken at %.2f", k)) }, scaled[:reasons].inspect)
    refute(plain[:reasons].any? { |r| r.start_with?("run taken at") })
    assert_operator scaled[:max_rps_per_process], :>, plain[:max_rps_per_process] * 1.1
  end
end
