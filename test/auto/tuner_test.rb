# frozen_string_literal: true

require "test_helper"
require "minitest/mock"
require "serval/auto/tuner"

# The tuner's schedule of model runs: each is a burst of Ruby requests wait
# behind, so while the model keeps giving the same knee it runs less often
# (the gap doubles up to MODEL_MAX_GAP), and a changed knee brings it back to
# every MODEL_EVERY intervals.
class AutoTunerTest < Minitest::Test
  Pool = Struct.new(:min, :max) do
    def resize(min, max)
      self.min = min
      self.max = max
    end
  end

  class FakeServer
    def window = { requests: 0 }
    def db_pools = nil
  end

  class Log
    def info(*) = nil
    def exception(*) = nil
  end

  def tuner
    options = { auto_interval: 1.0, min_threads: 1, threads_auto_max: 8, max_threads: 4 }
    Serval::Auto::Tuner.new(FakeServer.new, Pool.new(1, 4), options, Log.new)
  end

  # Runs `ticks` intervals with Model.call answering from `knees` (one knee
  # per call, the last repeated); returns the ticks at which the model ran.
  def model_ticks(ticks, knees)
    runs = []
    calls = 0
    model = lambda do |_window, max:|
      knee = knees[[calls, knees.size - 1].min]
      calls += 1
      runs << @tick
      rps = (1..max).map { |t| t < knee ? 100.0 * t / knee : 100.0 }
      { rps: rps, stall: Array.new(max, 0.0), requests: 1000, cpu_share: 0.3 }
    end
    t = tuner
    Serval::Auto::Model.stub(:call, model) do
      (1..ticks).each do |i|
        @tick = i
        t.tick
      end
    end
    runs
  end

  def test_the_model_runs_less_often_while_its_knee_stays_the_same
    runs = model_ticks(100, [4])
    gaps = runs.each_cons(2).map { |a, b| b - a }
    every = Serval::Auto::Tuner::MODEL_EVERY
    most = Serval::Auto::Tuner::MODEL_MAX_GAP
    assert_equal 1, runs.first, "the first run as soon as the window allows"
    assert_equal [every, every * 2, every * 4], gaps.first(3), runs.inspect
    assert_equal most, gaps.last, runs.inspect
    assert(gaps.all? { |g| g <= most }, runs.inspect)
  end

  def test_a_changed_knee_brings_the_model_back_to_every_few_intervals
    runs = model_ticks(60, [4, 4, 4, 6, 6])
    gaps = runs.each_cons(2).map { |a, b| b - a }
    every = Serval::Auto::Tuner::MODEL_EVERY
    # runs 1-3 the same knee (gaps grow), run 4 a new knee: the gap after it is back to MODEL_EVERY
    assert_equal [every, every * 2, every * 4, every], gaps.first(4), runs.inspect
  end
end
