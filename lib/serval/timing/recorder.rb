# frozen_string_literal: true

require "serval/gvl_trace"

module Serval
  class Timing
    # Measures requests for one process. The hot path is Request#timing_begin
    # and #timing_end (native: the record lives in the Request, the histograms
    # in C, updated with the GVL held; no allocation). One request in every
    # 1/sample_rate also gets a Serval::Timing in env["serval.timing"] with
    # thread CPU time (a system call) and GC time. #stats builds the
    # Prometheus-shaped aggregates and the gauges over the window since the
    # previous read.
    class Recorder
      METRICS = {
        "queue_seconds" => "Time a complete request waited in Serval before a thread called the app",
        "run_seconds" => "Time a request held the GVL (Ruby < 3.2: thread CPU time, sampled requests)",
        "idle_seconds" => "Time a request neither held nor wanted the GVL: I/O, sleep " \
                          "(Ruby < 3.2: wall - CPU of sampled requests, I/O and GVL stall together)",
        "stall_seconds" => "Time a request waited for the GVL (absent on Ruby < 3.2)",
        "request_upstream_queue_seconds" => "Time from the proxy's X-Request-Start / X-Queue-Start stamp " \
                                            "to the app call (requests with the header)",
        # the C histograms' order; this one only with Active Record (Native::PoolWait enabled)
        "request_pool_wait_seconds" => "Time a request was blocked checking out an Active Record database " \
                                       "connection (not counted in run, idle or stall)",
        # only where lock waits are told from idle (Ruby 3.3+, Native::GVL.lock_split?)
        "request_lock_seconds" => "Time a request waited for a Ruby lock (Mutex, Monitor, ConditionVariable, " \
                                  "Queue; not counted in idle)"
      }.freeze
      POOL_WAIT = "request_pool_wait_seconds"
      LOCK = "request_lock_seconds"
      # Counters: seconds summed over every request (Prometheus rate() of
      # them is a per-second share, the same for any number of scrapers).
      # name => [index in the C sums (nil: wall), help]
      COUNTERS = {
        "request_queue_seconds_total" => [0, "Seconds requests waited in Serval for a thread, summed"],
        "request_run_seconds_total" => [1, "Seconds requests held the GVL, summed (Ruby < 3.2: CPU time " \
                                           "of sampled requests only)"],
        "request_idle_seconds_total" => [2, "Seconds requests neither held nor wanted the GVL, summed " \
                                            "(Ruby < 3.2: wall - CPU of sampled requests)"],
        "request_stall_seconds_total" => [3, "Seconds requests waited for the GVL, summed (0 on Ruby < 3.2)"],
        "request_pool_wait_seconds_total" => [5, "Seconds requests were blocked checking out a database " \
                                                 "connection, summed (only with Active Record)"],
        "request_lock_seconds_total" => [6, "Seconds requests waited for a Ruby lock, summed (Ruby 3.3+)"],
        "request_wall_seconds_total" => [nil, "Seconds from app call to response handed to the core, " \
                                              "summed over every request"]
      }.freeze
      MIN_WINDOW = 1.0 # seconds; a read sooner than this reuses the last gauge values

      attr_reader :sample_rate

      def initialize(sample_rate: 0.05)
        @sample_rate = sample_rate.to_f
        @every = @sample_rate.positive? ? (1.0 / @sample_rate).round : 0
        @mutex = Mutex.new
        @window_at = nil
        @window_run = nil
        @utilization = 0.0
        Timing.attach # the core calls timing at each request from now on (ext/serval/hooks.h)
      end

      # Registers the GVL hook in this process (again after a fork) and starts
      # fresh aggregates. Returns whether the run/idle/stall split is available.
      def enable
        Timing.reset_aggregate
        Timing.window_reset
        Routes.reset
        Native::GVL.enable
        Native::GVL.enabled?
      end

      def gvl_split?
        Native::GVL.enabled?
      end

      # Requests whose timing goes into env["serval.timing"] (with CPU and GC
      # time): one in every. Every request is counted in the histograms.
      attr_reader :every

      def start(request, env)
        request.timing_begin(env, @every)
      end

      def finish(request, env)
        timing = request.timing_end
        GVLTrace.note(timing, env) if timing && GVLTrace.recording
        timing
      end

      # Server#stats[:timing]: the shape the Prometheus renderer takes.
      def stats
        counts, sums, cpu_total, bounds, wall_total, timed = Timing.aggregate
        slots = bounds.size + 1
        out = {}
        pool_wait = Native::PoolWait.enabled?
        lock = Native::GVL.lock_split?
        METRICS.each_with_index do |(name, help), m|
          next if name == POOL_WAIT && !pool_wait
          next if name == LOCK && !lock

          out[name] = histogram(help, counts[m * slots, slots], sums[m], bounds)
        end
        split = gvl_split?
        counters(out, sums, wall_total, timed, split)
        utilization, waiting = gauges(cpu_total)
        out["gvl_utilization"] = { type: :gauge, value: utilization,
                                   help: "Share of wall time some thread of this process held the GVL, " \
                                         "over the window since the previous read (deprecated: use " \
                                         "rate(serval_gvl_held_seconds_total))" \
                                         "#{split ? '' : ' (Ruby < 3.2: CPU time of sampled requests)'}" }
        out["gvl_waiting_threads"] = { type: :gauge, value: waiting,
                                       help: "Threads waiting for the GVL now (NaN on Ruby < 3.2)" }
        out["gvl_split"] = { type: :gauge, value: split ? 1 : 0,
                             help: "1 when run/idle/stall come from the GVL hook; 0 on Ruby < 3.2, where " \
                                   "run is CPU time and idle is wall - CPU (I/O and stall together)" }
        out
      end

      # Monotonic figures: take nothing from the previous read.
      def counters(out, sums, wall_total, timed, split)
        pool_wait = Native::PoolWait.enabled?
        lock = Native::GVL.lock_split?
        COUNTERS.each do |name, (index, help)|
          next if index == 5 && !pool_wait # as the histogram: only with Active Record
          next if index == 6 && !lock

          out[name] = { type: :counter, help: help, value: index ? sums[index] : wall_total }
        end
        out["requests_timed_total"] = { type: :counter, value: timed,
                                        help: "Requests measured into the timing figures" }
        global = Native::GVL.global
        held = global ? global[0] / 1e9 : Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
        out["gvl_held_seconds_total"] = {
          type: :counter, value: held,
          help: "Seconds some thread of this process held the GVL, request threads and others alike" \
                "#{split ? '' : ' (Ruby < 3.2: CPU time of the process)'}"
        }
        return unless global

        out["gvl_outside_requests_seconds_total"] = {
          type: :counter, value: global[2] / 1e9,
          help: "Seconds the GVL was held outside any request: the app's own threads, library threads " \
                "(e.g. Active Record's reaper), Serval's work between requests"
        }
      end

      private

      def histogram(help, counts, sum, bounds)
        cumulative = 0
        buckets = counts.each_with_index.map do |c, i|
          cumulative += c
          [bounds[i] || Float::INFINITY, cumulative]
        end
        { type: :histogram, help: help, buckets: buckets, sum: sum, count: cumulative }
      end

      # [run time / window, threads waiting now]; the window is the time since
      # the previous read that was at least MIN_WINDOW ago.
      def gauges(cpu_total)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        global = Native::GVL.global
        run = global ? global[0] / 1e9 : cpu_total
        waiting = global ? global[1] : Float::NAN
        @mutex.synchronize do
          if @window_at.nil?
            @window_at = now
            @window_run = run
          elsif now - @window_at >= MIN_WINDOW
            @utilization = ((run - @window_run) / (now - @window_at)).clamp(0.0, 1.0)
            @window_at = now
            @window_run = run
          end
          [@utilization, waiting]
        end
      end
    end
  end
end
