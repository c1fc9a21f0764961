# frozen_string_literal: true

require "serval/gvl_trace"

module Serval
  class Timing
    # Measures requests and keeps their aggregates. The hot path is two
    # Native::GVL.sample calls, two GC.total_time calls and a few array
    # increments on an accumulator owned by the calling thread: no locks.
    # #stats merges the accumulators (cumulative histograms, Prometheus style)
    # and computes the gauges over the window since the previous read.
    class Recorder
      BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0].freeze
      SLOTS = BUCKETS.size + 1 # the last one is +Inf
      METRICS = {
        "queue_seconds" => "Time a complete request waited in Serval before a thread called the app",
        "run_seconds" => "Time a request held the GVL (Ruby < 3.2: thread CPU time)",
        "idle_seconds" => "Time a request neither held nor wanted the GVL: I/O, sleep " \
                          "(Ruby < 3.2: wall - CPU, I/O and GVL stall together)",
        "stall_seconds" => "Time a request waited for the GVL (absent on Ruby < 3.2)"
      }.freeze
      QUEUE = 0
      RUN = 1
      IDLE = 2
      STALL = 3
      MIN_WINDOW = 1.0 # seconds; a read sooner than this reuses the last gauge values
      HEADERS = %w[HTTP_X_REQUEST_START HTTP_X_QUEUE_START].freeze
      ENV_KEY = "serval.timing"

      # Per-thread sums; only its thread writes it.
      class Accumulator
        attr_reader :counts, :sums, :cpu

        def initialize
          @counts = Array.new(METRICS.size * SLOTS, 0)
          @sums = Array.new(METRICS.size, 0.0)
          @cpu = 0.0
        end

        def add(metric, value)
          i = 0
          i += 1 while i < BUCKETS.size && value > BUCKETS[i]
          @counts[metric * SLOTS + i] += 1
          @sums[metric] += value
        end

        def add_cpu(value)
          @cpu += value
        end
      end

      attr_reader :sample_rate

      def initialize(sample_rate: 1.0)
        @sample_rate = sample_rate.to_f
        @accumulators = []
        @mutex = Mutex.new
        @key = :"__serval_timing_#{object_id}"
        @window_at = nil
        @window_run = nil
        @gauges = [0.0, 0]
      end

      # Registers the GVL hook in this process (again after a fork). Returns
      # whether the run/idle/stall split is available.
      def enable
        Native::GVL.enable
        Native::GVL.enabled?
      end

      def gvl_split?
        Native::GVL.enabled?
      end

      # Starts measuring a request whose env is built; nil when not sampled.
      def start(request, env)
        return nil if @sample_rate < 1.0 && rand >= @sample_rate

        s = Native::GVL.sample
        queue = s[0] / 1e9 - request.queued_at
        upstream = upstream_queue(env)
        env[ENV_KEY] = Timing.new(s, GC.total_time, queue.negative? ? 0.0 : queue, upstream)
      end

      def finish(timing, env)
        timing.finish(Native::GVL.sample, GC.total_time)
        GVLTrace.note(timing, env) if GVLTrace.recording
        acc = Thread.current[@key] || register
        acc.add(QUEUE, timing.queue)
        if timing.gvl_split?
          acc.add(RUN, timing.run)
          acc.add(IDLE, timing.idle)
          acc.add(STALL, timing.stall)
        else
          acc.add(RUN, timing.cpu)
          acc.add(IDLE, timing.wait)
          acc.add_cpu(timing.cpu)
        end
        timing
      end

      # Server#stats[:timing]: the shape the Prometheus renderer takes.
      def stats
        counts, sums = merged
        out = {}
        METRICS.each_with_index do |(name, help), m|
          out[name] = histogram(help, counts[m * SLOTS, SLOTS], sums[m])
        end
        utilization, waiting = gauges
        split = gvl_split?
        out["gvl_utilization"] = { type: :gauge, value: utilization,
                                   help: "Share of wall time some thread of this process held the GVL, " \
                                         "over the window since the previous read" \
                                         "#{split ? '' : ' (Ruby < 3.2: CPU time of measured requests)'}" }
        out["gvl_waiting_threads"] = { type: :gauge, value: waiting,
                                       help: "Threads waiting for the GVL now (NaN on Ruby < 3.2)" }
        out["gvl_split"] = { type: :gauge, value: split ? 1 : 0,
                             help: "1 when run/idle/stall come from the GVL hook; 0 on Ruby < 3.2, where " \
                                   "run is CPU time and idle is wall - CPU (I/O and stall together)" }
        out
      end

      private

      def upstream_queue(env)
        header = env[HEADERS[0]] || env[HEADERS[1]]
        return nil if header.nil?

        UpstreamQueue.seconds(header, Process.clock_gettime(Process::CLOCK_REALTIME))
      end

      def register
        acc = Accumulator.new
        @mutex.synchronize { @accumulators << acc }
        Thread.current[@key] = acc
      end

      def merged
        counts = Array.new(METRICS.size * SLOTS, 0)
        sums = Array.new(METRICS.size, 0.0)
        cpu = 0.0
        @mutex.synchronize { @accumulators.dup }.each do |acc|
          acc.counts.each_with_index { |c, i| counts[i] += c }
          acc.sums.each_with_index { |s, i| sums[i] += s }
          cpu += acc.cpu
        end
        @cpu_total = cpu
        [counts, sums]
      end

      def histogram(help, counts, sum)
        cumulative = 0
        buckets = counts.each_with_index.map do |c, i|
          cumulative += c
          [BUCKETS[i] || Float::INFINITY, cumulative]
        end
        { type: :histogram, help: help, buckets: buckets, sum: sum, count: cumulative }
      end

      # [run time / window, threads waiting now]; the window is the time since
      # the previous read that was at least MIN_WINDOW ago.
      def gauges
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        global = Native::GVL.global
        run = global ? global[0] / 1e9 : @cpu_total
        waiting = global ? global[1] : Float::NAN
        @mutex.synchronize do
          if @window_at.nil?
            @window_at = now
            @window_run = run
          elsif now - @window_at >= MIN_WINDOW
            @gauges[0] = ((run - @window_run) / (now - @window_at)).clamp(0.0, 1.0)
            @window_at = now
            @window_run = run
          end
          [@gauges[0], waiting]
        end
      end
    end
  end
end
