# frozen_string_literal: true

require "serval/ticker"
require "serval/fairness"
require "serval/auto/controller"
require "serval/auto/sampler"
require "serval/auto/model_process"
require "serval/auto/sample_table"

module Serval
  module Auto
    # `threads :auto` in one process: a low-priority thread that, every
    # `auto_interval` seconds, measures the interval (Sampler), refreshes the
    # model (Model, from Server#window, run in a nice-19 child process by
    # ModelProcess) every MODEL_EVERY intervals, less often
    # while it keeps giving the same knee (the gap doubles up to MODEL_MAX_GAP:
    # each run is a burst of Ruby that requests wait behind), asks the
    # Controller and applies its decision through ThreadPool#resize. Each
    # change is one log line, `threads: 4 -> 5 (reason; figures)`, and #stats
    # is what Server#stats shows under `auto:`.
    class Tuner
      MODEL_EVERY = 3   # intervals between model runs (the first as soon as the window allows)
      MODEL_MAX_GAP = 24 # most intervals between model runs while its knee stays the same
      RATE_DRIFT = 0.2  # the arrival rate moved this much from the model's: run it again
      PRIORITY = -3     # below request threads: the model's Ruby yields to them
      # Seconds the model's child gets at idle priority before the run is
      # skipped and later runs go to SCHED_BATCH. A run takes 0.2-1 s of
      # CPU; a child that has not answered in 10 s had less than a tenth of
      # the CPU to itself, and the process is as good as saturated. (At
      # ModelProcess::TIMEOUT, 30 s, auto's first change on a saturated
      # process came 40-60 s after its start, bench/NOTES.md "Session 31".)
      IDLE_TIMEOUT = 10.0

      # runner: what runs the model (a ModelProcess from #start on; nil: in
      # this process, as tests do).
      def initialize(server, pool, options, log_writer, runner: nil)
        @runner = runner
        @server = server
        @pool = pool
        @log_writer = log_writer
        @interval = options[:auto_interval]
        # the floor is a minimum given with auto, else 1 (Configuration.settle_auto)
        min = [options.fetch(:threads_auto_min, 0), 1].max
        @controller = Controller.new(min: [min, options[:threads_auto_max]].min, max: options[:threads_auto_max],
                                     initial: options[:max_threads])
        @spawn_min = options[:min_threads].to_i # threads started up front, never above the count auto sets
        @mutex = Mutex.new # the figures #stats reads
        @changed_at = nil
        @changes = 0
        @model = nil
        @model_at = nil
        @ticks = 0
        @model_gap = MODEL_EVERY
        @model_tick = nil
        @model_runs = 0
        @last = nil
      end

      attr_reader :controller

      # A Server part (ServerParts): threads :auto.
      def self.attach(server, options, log_writer)
        new(server, server.thread_pool, options, log_writer)
      end

      def start
        resize(@controller.target) if @pool.max != @controller.target
        @sampler ||= Sampler.new
        @runner ||= ModelProcess.new(timeout: IDLE_TIMEOUT)
        # with fair_timeslice on (Ruby 3.3+), the model's runs give the GVL to
        # waiting request threads every slice, as a request thread would
        @ticker = Ticker.new("serval-auto", @interval, @log_writer, priority: PRIORITY,
                             setup: -> { Fairness.apply(Thread.current) if Fairness.mode == :preempt },
                             on_error: ->(e) { @log_writer.exception(e, "threads: auto tick failed") })
        @ticker.start { tick }
        self
      end

      def stop
        @stopping = true # a model run cut short by the child's stop is not redone here
        @ticker&.stop(5)
        @runner&.stop if @runner.respond_to?(:stop)
      end

      def stats
        @mutex.synchronize do
          { target_threads: @controller.target, min_threads: @controller.min, max_threads: @controller.max,
            reason: @controller.reason, change_reason: @controller.change_reason, changed_at: stamp(@changed_at), changes: @changes,
            interval: @interval, model_threads: @model && knee(@model), model_at: stamp(@model_at),
            model_every: @model_gap, model_runs: @model_runs, model_open_threads: @model && open_best(@model),
            model_open_range: @controller.open_band,
            model_rate: @model && @model[:rate]&.round(2), model_p99_rate: @model && @model[:p99_rate]&.round(2) }
        end
      end

      # One interval: measure, maybe model, decide, apply. Public for tests.
      def tick
        @ticks += 1
        @sampler ||= Sampler.new
        m = @sampler.sample(threads: @pool.max, pools: @server.db_pools)
        refresh_model(m.rps) if @model.nil? || @ticks - @model_tick >= @model_gap || drifted?(m) || unseen?
        decision = @controller.observe(m, model: @model)
        apply(decision) if decision.changed
        @last = decision
      end

      private

      # The model's open-loop figures stop past the counts that matter; a
      # count it did not simulate (the pool moved there since) needs a run.
      def unseen?
        p99 = @model && @model[:p99]
        p99 && @pool.max <= p99.size && p99[@pool.max - 1].nil?
      end

      # In the child process (ModelProcess) when there is one; in this
      # process when it fails (said once in the log; the next run tries a
      # new child), unless the server is stopping (#stop ends the child). A child that got no CPU in time (idle priority on a CPU
      # the server keeps busy) is not replaced by a run here, which would take
      # the GVL from the requests then: the run is skipped (the controller
      # goes on with the last model) and later children run at nice 0 with
      # SCHED_BATCH (a fair share, never preempting a request thread) and
      # ModelProcess::TIMEOUT.
      def run_model(window, **options)
        return model_here(window, options) unless @runner

        @runner.call(window, **options)
      rescue ModelProcessTimeout => e
        if @runner.respond_to?(:priority=) && @runner.priority == :idle
          @runner.priority = :batch
          @runner.timeout = ModelProcess::TIMEOUT if @runner.respond_to?(:timeout=)
          @log_writer.warn("threads: auto's model got no CPU at idle priority (#{e.message}); it now runs at nice 0, " \
                           "SCHED_BATCH")
        end
        nil
      rescue ModelProcessError => e
        return nil if @stopping # the server stops: its child was ended under a waiting run

        @log_writer.warn("threads: auto runs its model in the server process this time (#{e.message})") unless @runner_failed
        @runner_failed = true
        model_here(window, options)
      end

      # The model run in this process. Its code (Auto::Model and the advice
      # library under it) loads only then: a server whose runs go to the child
      # does not keep it. Loaded, it is some 1,200 more objects that live as
      # long as the process in Ruby's smallest heap, which a busy app may have
      # sized to its own live set (bench/NOTES.md "Session 34").
      def model_here(window, options)
        require "serval/auto/model"
        Model.call(SampleTable.unpack(window), **options)
      end

      # The open-loop figures are for the rate the model ran at; a rate that
      # moved by more than RATE_DRIFT needs them again.
      def drifted?(m)
        rate = @model && @model[:rate]
        rate&.positive? && m.rps.positive? && (m.rps / rate - 1).abs > RATE_DRIFT
      end

      def refresh_model(rate)
        @model_tick = @ticks
        window = packed_window or return

        model = run_model(window, max: @controller.max, rate: rate.positive? ? rate : nil, through: @pool.max)
        return unless model

        @model_runs += 1
        same = @model && knee(@model) == knee(model) && open_best(@model) == open_best(model)
        @model_gap = same ? [@model_gap * 2, MODEL_MAX_GAP].min : MODEL_EVERY
        @mutex.synchronize do
          @model = model
          @model_at = Time.now
        end
      end

      # The window with its samples packed by column (SampleTable): the
      # thousands of Hashes it is read as are garbage before the run, which
      # waits for the child up to IDLE_TIMEOUT, instead of living through
      # it (and the minor GCs meanwhile) into the old generation.
      def packed_window
        window = @server.window
        window && SampleTable.pack(window)
      end

      def apply(decision)
        resize(decision.target)
        @mutex.synchronize do
          @changed_at = Time.now
          @changes += 1
        end
        @log_writer.info("threads: #{decision.from} -> #{decision.target} (#{decision.reason})")
      end

      # ISO 8601 in UTC with milliseconds, as Time#iso8601(3) writes it
      # (without loading time.rb into the server for two fields).
      def stamp(time) = time&.utc&.strftime("%Y-%m-%dT%H:%M:%S.%LZ")

      def resize(target) = @pool.resize([@spawn_min, target].min, target)

      def knee(model) = Controller.knee(model[:rps], @controller.settings[:fraction])

      # The count the controller goes to at part load with this model: the
      # fewest threads whose predicted open-loop p99 is within its open_gain
      # of the lowest, plus its open_margin while as good and a cliff is right
      # below (Controller.open_target; not the lowest's
      # own count: that wanders over the flat part from run to run).
      def open_best(model)
        p99 = model[:p99] or return nil
        @controller.open_target(p99, [p99.size, @controller.max].min)&.at(1)
      end
    end
  end
end
