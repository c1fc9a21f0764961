# frozen_string_literal: true

require "test_helper"
require "minitest/mock"
require "serval/auto/tuner"
require "serval/auto/model"
require "open3"
require "rbconfig"

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
    attr_reader :warnings

    def info(*) = nil
    def exception(*) = nil
    def warn(line) = (@warnings ||= []) << line
  end

  def tuner
    options = { auto_interval: 1.0, min_threads: 1, threads_auto_max: 8, max_threads: 4 }
    Serval::Auto::Tuner.new(FakeServer.new, Pool.new(1, 4), options, Log.new)
  end

  # A runner whose child got no CPU in time (idle priority on a busy CPU).
  class StarvedRunner
    attr_accessor :priority, :timeout
    attr_reader :calls

    def initialize
      @priority = :idle
      @timeout = Serval::Auto::Tuner::IDLE_TIMEOUT
      @calls = 0
    end

    def call(*, **)
      @calls += 1
      raise Serval::ModelProcessTimeout, "model process: no answer in 30.0 s"
    end
  end

  # A timeout skips the run (no model in the server process, which would
  # take the GVL from requests) and raises the next children's priority.
  def test_a_starved_child_skips_the_run_and_raises_the_priority
    runner = StarvedRunner.new
    log = Log.new
    options = { auto_interval: 1.0, min_threads: 1, threads_auto_max: 8, max_threads: 4 }
    t = Serval::Auto::Tuner.new(FakeServer.new, Pool.new(1, 4), options, log, runner: runner)
    in_process = 0
    Serval::Auto::Model.stub(:call, ->(*, **) { in_process += 1 }) do
      t.send(:refresh_model, 10.0)
      t.send(:refresh_model, 10.0)
    end
    assert_equal 0, in_process, "never run in the server process after a timeout"
    assert_equal 2, runner.calls
    assert_equal :batch, runner.priority
    assert_equal Serval::Auto::ModelProcess::TIMEOUT, runner.timeout, "a batch child gets the full timeout"
    assert_equal 1, log.warnings.size
    assert_match(/no CPU at idle priority.*nice 0, SCHED_BATCH/, log.warnings.first)
    assert_equal 0, t.stats[:model_runs]
  end

  # Auto's own child waits IDLE_TIMEOUT at idle priority, a third of the
  # default: on a saturated process the first model comes that much sooner.
  def test_the_tuner_gives_its_idle_child_a_shorter_timeout
    t = tuner
    t.start
    runner = t.instance_variable_get(:@runner)
    assert_instance_of Serval::Auto::ModelProcess, runner
    assert_equal Serval::Auto::Tuner::IDLE_TIMEOUT, runner.timeout
    assert_operator Serval::Auto::Tuner::IDLE_TIMEOUT, :<, Serval::Auto::ModelProcess::TIMEOUT
  ensure
    t&.stop
  end

  # A runner whose child ended (EOF on its pipe).
  class BrokenRunner
    attr_reader :calls

    def call(*, **)
      @calls = calls.to_i + 1
      raise Serval::ModelProcessError, "model process: EOFError: end of file reached"
    end

    def stop = nil
  end

  # A broken child: the run is done in the server process this time, said
  # once. But when the server is stopping (#stop ends the child under a run
  # that waits for it), nothing is run here and nothing is said: a graceful
  # stop does not spend its time on a model.
  def test_a_broken_child_runs_here_except_while_stopping
    options = { auto_interval: 1.0, min_threads: 1, threads_auto_max: 8, max_threads: 4 }
    log = Log.new
    t = Serval::Auto::Tuner.new(FakeServer.new, Pool.new(1, 4), options, log, runner: BrokenRunner.new)
    in_process = 0
    Serval::Auto::Model.stub(:call, ->(*, **) { in_process += 1 }) do
      t.send(:refresh_model, 10.0)
      assert_equal 1, in_process
      assert_match(/runs its model in the server process this time/, log.warnings.first)
      t.stop
      t.send(:refresh_model, 10.0)
    end
    assert_equal 1, in_process, "not run in the server process while it stops"
    assert_equal 1, log.warnings.size
  end

  # Runs `ticks` intervals with Model.call answering from `knees` (one knee
  # per call, the last repeated); returns the ticks at which the model ran.
  def model_ticks(ticks, knees, p99s: nil)
    runs = []
    @rates = []
    calls = 0
    model = lambda do |_window, max:, rate: nil, through: nil|
      @rates << rate
      knee = knees[[calls, knees.size - 1].min]
      calls += 1
      runs << @tick
      rps = (1..max).map { |t| t < knee ? 100.0 * t / knee : 100.0 }
      p99 = p99s && p99s[(calls - 1) % p99s.size]
      { rps: rps, stall: Array.new(max, 0.0), p99: p99, requests: 1000, cpu_share: 0.3, rate: rate }
    end
    t = tuner
    @tuner = t
    t.instance_variable_set(:@sampler, @sampler) if @sampler
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

  # The lowest predicted p99 wanders over a flat top from run to run (3, 6,
  # 4): the part-load target (the fewest within 5 % of the lowest, 2, plus
  # one: 3) does not, so the gap still grows, and /stats shows that target,
  # the count auto goes to, as model_open_threads.
  def test_a_wandering_lowest_p99_on_a_flat_top_is_the_same_part_load_target
    inf = Float::INFINITY
    flat = [[inf, 0.105, 0.100, 0.102, 0.103, 0.104, 0.104, 0.106],
            [inf, 0.104, 0.103, 0.102, 0.101, 0.100, 0.103, 0.104],
            [inf, 0.103, 0.102, 0.100, 0.102, 0.101, 0.103, 0.105]]
    runs = model_ticks(40, [4], p99s: flat)
    every = Serval::Auto::Tuner::MODEL_EVERY
    assert_equal [every, every * 2, every * 4], runs.each_cons(2).map { |a, b| b - a }.first(3), runs.inspect
    assert_equal 3, @tuner.stats[:model_open_threads]
    assert_nil @tuner.stats[:model_open_range], "no part-load decision yet (no requests measured)"
  end

  # Measurements at a given req/s per tick (the sampler's place).
  class FakeSampler
    def initialize(rates) = @rates = rates
    def sample(threads:, pools: nil)
      rps = @rates.shift || 0.0
      Serval::Auto::Measurement.new(seconds: 1.0, requests: rps.round, threads: threads, queue_p90: 0.0,
                                    stall_mean: 0.0, wall_mean: 0.02, gvl: 0.5)
    end
  end

  # The model's open-loop figures are for the arrival rate it ran at: it is
  # given the interval's req/s, and a rate that moves by more than
  # RATE_DRIFT runs it again at once (not after the grown gap).
  def test_the_model_runs_at_the_measured_rate_and_again_when_the_rate_moves
    @sampler = FakeSampler.new(Array.new(20, 50.0) + Array.new(5, 55.0) + Array.new(10, 80.0))
    runs = model_ticks(35, [4])
    assert_equal 50.0, @rates.first
    assert_equal [1, 4, 10], runs.first(3), "the gap grows while the rate holds (+10 % is within the drift)"
    assert_includes runs, 26, "80 req/s is 60 % above the model's 50: run again at the first such interval"
    assert_equal 80.0, @rates[runs.index(26)]
    assert_operator runs.count { |r| r > 26 }, :<=, 1, "and then the gap again, not every tick: #{runs.inspect}"
  end

  # The model runs in its child: a server with auto keeps the advice
  # library out of its heap (loaded, it is objects for the process's life
  # in the heap a busy app fills). Loaded only for a run in this process.
  def test_auto_in_the_server_does_not_load_the_model_until_it_runs_one_here
    lib = File.expand_path("../../lib", __dir__)
    model = %w[serval/advice.rb serval/auto/model.rb]
    script = "f = -> { $LOADED_FEATURES.count { |p| #{model}.any? { |m| p.end_with?(m) } } }; " \
             'require "serval/auto/tuner"; puts f.call; require "serval/auto/model"; puts f.call'
    out, status = Open3.capture2e(RbConfig.ruby, "-I", lib, "-e", script) # bounded by the test helper
    assert status.success?, out
    before, after = out.split.map(&:to_i)
    assert_equal 0, before, "the tuner alone loads none of the model's code"
    assert_equal 2, after, "the model brings the advice library (else this test shows nothing)"
  end
end
