# frozen_string_literal: true

require "serval/advice/threads_text"

module Serval
  module Advice
    # From a Window to a recommendation. #call returns a JSON-able Hash:
    #
    #   requests             requests in the window
    #   needed               the minimum it takes (DEFAULTS[:min_requests])
    #   enough_data          false: every figure below is nil, warnings say why
    #   threads              max threads per process (the knee, capped by the pool)
    #   processes            per machine (CPUs, bounded by memory)
    #   cpu_share            mean run / (run + io) of a request (0..1)
    #   max_rps_per_process  predicted closed-loop req/s at `threads`
    #   max_rps_per_machine  x processes
    #   knee                 the knee before the pool cap / stall limit
    #   knee_99              the fewest threads reaching TOP_FRACTION (99 %) of the best simulated req/s:
    #                        far above the knee, the top is flat and a measured sweep's knee moves by
    #                        threads with a few per cent of noise (bench/NOTES.md "The knee on mixed routes")
    #   p99_threads          nil, or at the top load point's rate (load_points.max x max_rps_per_process),
    #                        the open-loop p99 predicted per thread count: {load:, rate:, threads: the
    #                        fewest within P99_NEAR (5 %) of the lowest, lowest_at:, p99:, lowest_p99:,
    #                        tried: [[threads, p99], ...]} (counts that cannot keep up are not tried)
    #   threads_range        [fewest, most]: the threads advised at the ends of the 95 % interval of the
    #                        requests' run / io ratio (its sampling error: Workload#ratio_within), always
    #                        holding `threads`; it narrows as requests accumulate (nil: range: false, or
    #                        under 30 paired samples) - range: {within:, basis:, knees:}
    #   stall                predicted mean and p95 GVL stall per request at `threads`, saturated
    #   sweep                one row per thread count: rps, gain, stall, wall p50/p99
    #   load                 open-loop latency at DEFAULTS[:load_points] of max req/s
    #   precision            {samples:, mean_of:, run_mean_within:, max_rps_range:, load: {load:, rate:,
    #                        latency_p99_range:}}: the same figures with the window's mean GVL time
    #                        per request at the ends of its 95 % interval (mean_of: the requests that
    #                        mean rests on, the run histogram's when the samples are calibrated to it;
    #                        nil: precision: false, fewer than 30 samples, histograms only)
    #   routes               nil, or per route (samples with a `route`), most time first, top 8 + "other":
    #                        {route:, samples:, share_requests:, share_time:, mean_run:, mean_io:, cpu_share:,
    #                        wall_p99:, alone:} (alone: the knee if the process served only that route)
    #   amdahl, gvl_ceiling  the articles' two rules, for explanation
    #   lock                 nil, or the requests' waits for Ruby locks (Ruby 3.3+) and how the model
    #                        plays them (Advice::Lock): {measured_mean:, share_of_wall:, threads:, rate:,
    #                        share:, simulated_mean:, reproduced:, predicted_mean:} (predicted_mean: at
    #                        `threads`, saturated; share nil: not modelled)
    #   pool, database, machine, capacity (with target_rps), measured
    #   reasons, warnings    Arrays of sentences; summary: one line for the log
    #   gc_warning           the warning of a small heap's back-to-back major GCs (also in warnings), or nil
    class Recommender
      TOP_FRACTION = 0.99 # knee_99
      P99_NEAR = 0.05     # p99_threads: counts whose p99 is within this share of the lowest are alike
      OPEN_ROOM = 1.02    # a count is tried open loop when its closed-loop req/s exceeds the rate by this
      P99_PAST = 2        # ... from one below the knee / advised count to this many past the knee_99 / advised count

      GC_MAJOR_RATE = 2.0 # major GCs a second (most for want of free slots) that earn a warning (a steady
                          # small heap ran 1-1.4; one running away 2 -> 23, bench/NOTES.md "Session 33")
      GC_HEAP_GROWTH = 4  # the initial slots the warning suggests: this many times the heap's now

      RUBY31 = "Ruby 3.1 has no GVL hook: run is the CPU time of sampled requests and idle is wall - CPU, " \
               "which also holds the time spent waiting for the GVL; when requests stalled, this overstates " \
               "I/O and so the threads advised. Ruby 3.2+ measures run, idle and stall apart."

      def initialize(window, machine: nil, worker_bytes: nil, machines: 1, extra_connections: 0,
                     db_max_connections: nil, target_rps: nil, stall_limit: nil, **settings)
        unknown = settings.keys - DEFAULTS.keys
        raise ArgumentError, "unknown advice option(s): #{unknown.join(', ')}" if unknown.any?

        @window = window.is_a?(Window) ? window : Window.new(window)
        @s = DEFAULTS.merge(settings)
        @facts = machine.respond_to?(:to_h) ? machine.to_h.dup : {}
        @facts[:worker_bytes] = worker_bytes if worker_bytes
        @fleet = { machines: machines, extra_connections: extra_connections, max_connections: db_max_connections }
        @target = target_rps
        @stall_limit = stall_limit
        @cpu_scale = nil
        @load_scale = nil
      end

      def call
        w = @window
        @warnings = []
        @reasons = []
        @gc_warning = nil
        @warnings << RUBY31 unless w.gvl_split?
        warn_of_gc
        return too_little if w.requests < @s[:min_requests] || w.measured < [@s[:min_requests] / 10, 1].max

        decide
      end

      private

      # The GVL time slice to simulate: the one the server ran with
      # (fair_timeslice, in the window), else the `quantum` setting (Ruby's).
      def quantum = @window.timeslice || @s[:quantum]

      def base
        { requests: @window.requests, needed: @s[:min_requests], enough_data: false, threads: nil, processes: nil,
          cpu_share: nil, max_rps_per_process: nil, running_threads: @window.max_threads,
          gvl_split: @window.gvl_split?, reasons: @reasons, warnings: @warnings, gc_warning: @gc_warning }
      end

      # Major GCs that a small heap forces one after another (Timing::GcRecord):
      # each stops every thread, so the requests' tail is the GC's, whatever
      # the thread count; a larger initial heap ends them.
      def warn_of_gc
        g = @window.gc or return
        rate = @window.major_gc_rate
        return unless rate >= GC_MAJOR_RATE && g[:nofree] && g[:heap] && 2 * g[:nofree] >= g[:majors]

        heap = g[:heap]
        slots = (heap[:slots] * GC_HEAP_GROWTH / 10_000.0).ceil * 10_000
        @gc_warning = format("major GCs: %.1f a second over %.0f s, %d %% of them because the %d-byte heap (%d slots) had " \
                            "no free slots after a minor GC; each stops every thread and lengthens the tail at any " \
                            "thread count. A larger initial heap ends them: RUBY_GC_HEAP_%d_INIT_SLOTS=%d (Ruby 3.3+)",
                            rate, g[:seconds], (100.0 * g[:nofree] / [g[:majors], 1].max).round.clamp(0, 100),
                            heap[:slot_size], heap[:slots], heap[:index], slots)
        @warnings << @gc_warning
      end

      def too_little
        msg = if @window.requests < @s[:min_requests]
                "#{@window.requests} requests measured, need #{@s[:min_requests]}"
              else
                "#{@window.measured} of #{@window.requests} requests carry run/idle figures, " \
                  "need #{[@s[:min_requests] / 10, 1].max}"
              end
        @warnings.unshift(msg)
        base.merge(summary: "advice: #{msg}")
      end

      def decide
        workload = lock_modelled(ruby31_corrected(@window.workload))
        cpu_scaled
        load_scaled
        unless (workload.mean_run + workload.mean_io).positive?
          @warnings.unshift("the measured requests took no measurable time: nothing to model")
          return base.merge(summary: "advice: #{@warnings.first}")
        end
        profiles = workload.profiles(@s[:sim_requests], Random.new(@s[:seed]))
        @sim_options = workload.sim_options
        sim = Simulation.new(profiles, quantum: quantum, handoff: @window.handoff, speed: @window.replayed_speed, **@sim_options)
        sweep = Sweep.new(sim, max: [@s[:sweep_max], @window.max_threads || 0].max, fraction: @s[:knee_fraction])
        knee = sweep.knee
        @reasons << format("throughput levels off at %d threads: %.1f req/s, %d %% of the best simulated (%.1f)",
                           knee, sweep.at(knee).rps, (100 * sweep.at(knee).rps / sweep.best).floor, sweep.best)
        if knee == sweep.rows.size && sweep.rows.size > 1
          @warnings << format("throughput still grows at %d threads (%.1f req/s): the requests hardly use the " \
                              "GVL; more threads would serve more, at the cost of memory and database " \
                              "connections", knee, sweep.best)
        end
        threads = stall_capped(sweep, knee)
        pool, threads = pool_capped(profiles, sweep, threads)
        chosen = sweep.at(threads)
        knee_99 = flat_top(sweep, knee)
        tail = p99_threads(workload, sim, sweep, chosen.rps, [knee, threads].min - 1, [knee_99, threads].max)
        procs = Processes.call(@facts, headroom: @s[:memory_headroom])
        @warnings.concat(procs.delete(:warnings))
        db = Database.call(threads: threads, processes: procs[:processes], **@fleet,
                           other_threads: @window.pools.map { |p| p[:other_threads] }.max || 0)
        @warnings.concat(db.delete(:warnings))
        share = workload.cpu_share
        range = threads_range(workload, sim, threads, pool, knee)
        result = base.merge(
          enough_data: true, threads: threads, threads_range: range && range[:threads],
          range: range && range.except(:threads), processes: procs[:processes], cpu_share: share.round(4),
          max_rps_per_process: chosen.rps.round(2), max_rps_per_machine: (chosen.rps * procs[:processes]).round(2),
          knee: knee, knee_99: knee_99, p99_threads: tail, stall: { mean: chosen.stall_mean.round(6), p95: chosen.stall_p95.round(6) },
          workload: { mean_run: workload.mean_run.round(6), mean_io: workload.mean_io.round(6),
                      io_waits: workload.io_waits, samples: @window.measured, tail_cpu: workload.tail_cpu.round(6),
                      gvl_between: @window.gvl_between, between: workload.between.round(6),
                      cpu_per_request: @window.cpu_per_request&.round(9), cpu_scale: @cpu_scale&.round(4),
                      cpu_fit: @window.cpu_fit&.compact, load_scale: @load_scale&.round(4),
                      idle_cpu_wait: @window.idle_cpu_wait, idle_send_wait: @window.idle_send_wait,
                      idle_send_hidden: @window.idle_send_hidden,
                      estimated_stall: @estimated_stall&.round(6) },
          sweep: sweep.table, load: load_points(open_sim(workload, sim), threads, chosen.rps),
          precision: precision(workload, sim, threads, chosen.rps),
          amdahl: { io_share: (1 - share).round(4), pick: Amdahl.pick(1 - share),
                    table: Amdahl.table(1 - share, max: sweep.max) },
          gvl_ceiling: GvlCeiling.call(workload.mean_run, workload.mean_io),
          pool: pool, database: db, machine: procs, measured: measured(sim, sweep), routes: routes,
          lock: @lock && @lock.merge(predicted_mean: @lock[:share] ? chosen.lock_wait_mean.to_f.round(6) : nil),
          cpu_steadiness: Steadiness.call(@window.cpu_speed),
          capacity: @target && Capacity.plan(open_sim(workload, sim), target_rps: Float(@target), threads: threads, max_rps: chosen.rps,
                                                  processes: procs[:processes], utilization: @s[:target_utilization],
                                                  rng: Random.new(@s[:seed] + 2))
        )
        explain(result)
        steadiness_note(result[:cpu_steadiness])
        result.merge(summary: summary(result))
      end

      # The run the model plays when the GVL time it would charge a request
      # exceeds the process's whole CPU per request (Window#cpu_scale): say
      # so, with the factor (workload's cpu_scale: nil when not scaled).
      def cpu_scaled
        k = @window.cpu_scale
        return unless k < 1.0

        @cpu_scale = k
        @reasons << format("run taken at %.2f of its measured %.3f ms: the GVL time charged per request " \
                           "(run, GVL between requests, CPU beyond the GVL) exceeded the process's whole CPU " \
                           "per request over the window (%.3f ms); the rest was GVL held off a CPU",
                           k, @window.unscaled_workload.mean_run * 1e3, @window.cpu_per_request * 1e3)
      end

      # The run the model plays when the window's per-step fit says a
      # request costs less CPU at saturation than over the window
      # (Window#load_scale): say so (workload's load_scale: nil when not
      # scaled).
      def load_scaled
        k = @window.load_scale
        return unless k < 1.0

        @load_scale = k
        f = @window.cpu_fit
        @reasons << format("run taken at a further %.2f: over %d steps of 0.25 s the process spent %.3f CPU " \
                           "seconds a second whatever its rate and %.3f ms per request more, so a request " \
                           "costs %.3f ms once the process is busy where the window's rate gave %.3f ms",
                           k, f[:steps], f[:fixed], f[:per_request] * 1e3,
                           @window.saturated_cpu_per_request * 1e3, @window.cpu_per_request * 1e3)
      end

      # The open-loop figures replay the CPU's measured dips; say how unsteady
      # it was, and warn when it lost a tenth of its speed often enough to
      # move p99 near capacity.
      def steadiness_note(st)
        return unless st

        @reasons << if @window.replayed_speed
                      format("p50 and p99 under load replay this CPU's speed over %d busy 0.25 s steps " \
                             "(%d %% of them below 90 %% of full speed, the slowest at %d %%)",
                             st[:steps], (st[:below_0_9] * 100).round, (st[:min] * 100).round)
                    else
                      format("p50 and p99 under load take the CPU at its mean speed: %d busy 0.25 s steps " \
                             "(%d %% of them below 90 %% of full speed) are too few to replay (%d: 30 s), " \
                             "one pause of the machine would stand for too much of the time",
                             st[:steps], (st[:below_0_9] * 100).round, Window::SPEED_REPLAY_MIN_STEPS)
                    end
        return unless st[:below_0_9] >= Steadiness::UNSTEADY

        @warnings << format("the CPU is unsteady: %d %% of busy 0.25 s steps ran below 90 %% of full speed " \
                            "(a shared or throttled CPU: hypervisor steal, a cgroup quota, other processes); " \
                            "tails near capacity are longer than on a dedicated CPU", (st[:below_0_9] * 100).round)
      end

      # Ruby 3.1: take the model's estimate of the stall out of the waits,
      # when the window's load is known.
      def ruby31_corrected(workload)
        w = @window
        return workload if w.gvl_split? || !w.seconds&.positive? || !w.max_threads || w.max_threads < 2

        corrected, stall = StallEstimate.call(workload, threads: w.max_threads, rate: w.rate_per_process,
                                                        requests: [@s[:sim_requests] / 4, 2000].max, seed: @s[:seed])
        @estimated_stall = stall
        @reasons << format("Ruby 3.1: the model puts %.1f ms of each request's wait (wall - CPU) down to GVL stall " \
                           "at %d threads and %.1f req/s, and counts the rest as I/O", stall * 1e3, w.max_threads,
                           w.rate_per_process)
        corrected
      end

      # Waits for Ruby locks (Ruby 3.3+): not I/O (the window keeps them out
      # of idle); played as one lock the threads share (Advice::Lock).
      def lock_modelled(workload)
        @lock = Lock.calibrate(workload, @window, quantum: quantum, handoff: @window.handoff, seed: @s[:seed])
        l = @lock or return workload
        what = format("requests waited %.2f ms each for Ruby locks (Mutex, Monitor - e.g. Logger's -, Queue)%s",
                      l[:measured_mean] * 1e3, l[:share_of_wall] ? format(", %.1f %% of their time", l[:share_of_wall] * 100) : "")
        unless l[:share]
          why = if l[:share_of_wall] && l[:share_of_wall] < Lock::MIN_SHARE
                  "too little to model"
                else
                  "the window has no thread count to calibrate the lock at"
                end
          @reasons << "#{what}: counted as neither I/O nor CPU, and not modelled (#{why})"
          return workload
        end
        held = l[:held] == :sends ? format("sends (waits of at most %d us: a logger's writes)", (l[:within] * 1e6).round) : "waits"
        @reasons << format("%s at %d threads: not I/O - modelled as one lock held through %d %% of the requests' " \
                           "%s and until the GVL comes back, which gives %.2f ms at %d threads%s%s; more threads " \
                           "wait longer for it", what, l[:threads], (l[:share] * 100).round, held, l[:simulated_mean] * 1e3,
                           l[:threads], l[:rate] ? format(" and %.1f req/s", l[:rate]) : "",
                           l[:measured_waited] ? format(", %d %% of requests waiting (%d %% measured)", (l[:simulated_waited] * 100).round,
                                                        (l[:measured_waited] * 100).round) : "")
        unless l[:reproduced]
          @warnings << format("the lock model gives %.2f ms of lock wait per request where %.2f ms were measured: " \
                              "the lock is held for something the model does not see (CPU inside the lock, " \
                              "several locks)", l[:simulated_mean] * 1e3, l[:measured_mean] * 1e3)
        end
        workload.with_lock(l[:share], within: l[:within])
      end

      # Where the top really levels off (knee_99), said when it is past the
      # knee: a curve that creeps on after reaching 95 % of its best makes
      # the 95 % knee of a measured sweep a coin toss between these counts
      # (bench/NOTES.md "The knee on mixed routes": a few per cent of noise
      # per point moved it from 6 to 11 on a CPU-saturated server).
      def flat_top(sweep, knee)
        top = sweep.fewest(TOP_FRACTION)
        if top > knee
          @reasons << format("the top is flat: %d threads serve %.1f req/s, %d %% of the best simulated (%.1f); " \
                             "%d threads reach 99 %% (%.1f); more threads than the knee add little throughput, " \
                             "and a measured sweep's 95 %% point can land anywhere between", knee, sweep.at(knee).rps,
                             (100 * sweep.at(knee).rps / sweep.best).floor, sweep.best, top, sweep.at(top).rps)
        end
        top
      end

      # The thread count with the best tail under load (p99_threads in the
      # class comment): the knee is about throughput, this about latency at
      # part load, the figure a user tunes for. Counts from `from` (one
      # below the knee or the advised count: fewer threads only lengthen the
      # queue at this load, and a count barely keeping up is the costliest
      # to simulate) or the first that keeps up with the rate, upward, the
      # same arrivals for each (common random numbers), until two in a row
      # came out worse than the lowest, and always through `through` (the
      # knee_99 or the advised count), at most P99_PAST past it. Played with
      # the sweep's requests (sim_requests), not the load points' (5x more):
      # the counts are compared on the same arrivals; its p99 figures are
      # coarser than `load`'s. nil without load points
      # or when no count keeps up.
      def p99_threads(workload, sim, sweep, max_rps, from, through)
        load = @s[:load_points].max or return nil
        rate = load * max_rps
        return nil unless rate.positive?

        osim = sim # the sweep's sim_requests, not load_requests: counts are compared on the same arrivals, 5x cheaper
        tried = []
        worse = 0
        ([from, 1].max..[through + P99_PAST, sweep.max].min).each do |t|
          next if sweep.at(t).rps <= rate * OPEN_ROOM

          p99 = osim.open(t, rate: rate, rng: Random.new(@s[:seed] + 1)).latency_p99
          lowest = tried.map(&:last).min
          worse = lowest && p99 > lowest ? worse + 1 : 0
          tried << [t, p99]
          break if t >= through && worse >= 2
        end
        return nil if tried.empty?

        lo_t, lo = tried.min_by { |t, v| [v, t] }
        near_t, near = tried.find { |_t, v| v <= lo * (1 + P99_NEAR) }
        @reasons << format("at %d %% of max req/s (%.1f req/s) the predicted p99 is lowest at %d threads (%.0f ms) and within " \
                           "%d %% of it from %d threads (%.0f ms)", (load * 100).round, rate, lo_t, lo * 1e3,
                           (P99_NEAR * 100).round, near_t, near * 1e3)
        { load: load, rate: rate.round(2), threads: near_t, lowest_at: lo_t, p99: near.round(6), lowest_p99: lo.round(6),
          tried: tried.map { |t, v| [t, v.round(6)] } }
      end

      # The articles' last step: fewer threads while the stall is too long.
      def stall_capped(sweep, threads)
        return threads unless @stall_limit

        threads -= 1 while threads > 1 && sweep.at(threads).stall_mean > @stall_limit
        if threads < sweep.knee
          @reasons << format("lowered to %d threads to keep the predicted mean stall under %.0f ms (%.1f ms)",
                             threads, @stall_limit * 1e3, sweep.at(threads).stall_mean * 1e3)
        end
        threads
      end

      # Never more threads than the pool has connections: say so and show
      # what the pool costs.
      def pool_capped(profiles, sweep, threads)
        pool = @window.pool
        return [nil, threads] unless pool

        info = { name: pool[:name], size: pool[:size], binds: threads > pool[:size] }
        if info[:binds]
          over = Simulation.new(profiles, quantum: quantum, pool: pool[:size], handoff: @window.handoff,
                                **@sim_options).closed(threads)
          info[:pool_wait_if_unchanged] = over.pool_wait_mean.round(6)
          @warnings << format(
            "the database pool binds: pool %s has %d connections and the knee is %d threads, so %d threads " \
            "(%.1f req/s). With pool %d: %.1f req/s. %d threads on %d connections would wait %.1f ms per " \
            "request for a connection", pool[:name].inspect, pool[:size], threads, pool[:size],
            sweep.at(pool[:size]).rps, threads, sweep.at(threads).rps, threads, pool[:size], over.pool_wait_mean * 1e3
          )
          threads = pool[:size]
        end
        [info, threads]
      end

      # The answer's sampling error: the run / io ratio's 95 % interval
      # (Workload#ratio_within) played as every CPU segment that much longer
      # (fewer threads) and shorter (more), each swept like the answer
      # itself, capped by the same pool. The answer stays the middle
      # estimate; the range says how far the window's own data leaves it.
      def threads_range(workload, sim, threads, pool, knee)
        return nil unless @s[:range]

        run_key = @window.samples.any? { |s| s[:run] } ? :run : :cpu
        idle_key = @window.samples.any? { |s| s[:idle] } ? :idle : :wall
        basis = [@window.mean_basis(run_key), @window.mean_basis(idle_key)].min
        k = workload.ratio_within(basis: basis) or return nil

        max = [@s[:sweep_max], @window.max_threads || 0].max
        knees = [1 + k, 1 - k].map { |f| Sweep.new(sim.scaled(f), max: max, fraction: @s[:knee_fraction], near: knee).knee }
        knees = knees.map { |t| [t, pool[:size]].min } if pool&.dig(:binds) || (pool && knees.max > pool[:size])
        lo = [knees.min, threads].min
        hi = [knees.max, threads].max
        share_lo, share_hi = [1 - k, 1 + k].map { |f| (r = f * workload.mean_run) / (r + workload.mean_io) }
        if lo != hi
          @reasons << format("from %s requests the run / io ratio is known to +-%.1f %% (95 %%): cpu share %.2f-%.2f, " \
                             "%d-%d threads", grouped(basis), 100 * k, share_lo, share_hi, lo, hi)
        end
        { threads: [lo, hi], within: k.round(4), basis: basis, knees: knees.sort,
          cpu_share: [share_lo.round(4), share_hi.round(4)] }
      end

      # Per route (Routes): the mix the model plays, explained; each top
      # route's own knee from a shorter sweep of its samples alone.
      def routes
        max = [@s[:sweep_max], @window.max_threads || 0].max
        n = [@s[:sim_requests] / 4, 2000].max
        list = @window.route_samples.any? ? @window.route_samples : @window.samples
        Routes.call(list) do |pairs|
          w = Workload.new(pairs: pairs, io_waits: @window.io_waits || 1)
          next nil unless (w.mean_run + w.mean_io).positive?

          sim = Simulation.new(w.profiles(n, Random.new(@s[:seed])), quantum: quantum, handoff: @window.handoff)
          Sweep.new(sim, max: max, fraction: @s[:knee_fraction]).knee
        end
      end

      # The model for open-loop points: p99 near capacity rests on a few
      # long busy periods, so it plays `load_requests` requests (the sweep's
      # first `sim_requests` and more from the same draw). On a 70 % CPU
      # workload at 80 % load, six seeds put p99 within +-12 % of their mean
      # at 20,000 requests and +-4 % at 100,000.
      def open_sim(workload, sim)
        n = @s[:load_requests]
        return sim if n <= @s[:sim_requests]

        @open_sim ||= Simulation.new(workload.profiles(n, Random.new(@s[:seed])), quantum: quantum,
                                     handoff: @window.handoff, speed: @window.replayed_speed, **workload.sim_options)
      end

      def load_points(sim, threads, max_rps)
        @s[:load_points].map do |f|
          Capacity.at(sim, threads: threads, rate: f * max_rps, rng: Random.new(@s[:seed] + 1)).merge(load: f)
        end
      end

      # How much the window's own sampling leaves open: its sampled requests
      # give the mean GVL time per request to within 1.96 x sd / mean /
      # sqrt(n) (95 %; exponential times of 1,500 requests: +-5 %). The
      # model is run again with every CPU segment that much longer and
      # shorter: max req/s at the advised threads, and p99 at the highest
      # load point's *rate* (the same arrivals, a process a little slower
      # or faster), which near capacity moves far more than max req/s.
      # nil with fewer than 30 samples (or histograms only).
      def precision(workload, sim, threads, max_rps)
        return nil unless @s[:precision]

        runs = @window.samples.filter_map { |s| s[:run] || s[:cpu] }.map { |v| Float(v) }
        return nil if runs.size < 30

        mean = runs.sum / runs.size
        return nil unless mean.positive?

        sd = Math.sqrt(runs.sum { |v| (v - mean)**2 } / (runs.size - 1))
        basis = [@window.mean_basis(@window.samples.any? { |s| s[:run] } ? :run : :cpu), runs.size].max
        k = [1.96 * sd / mean / Math.sqrt(basis), 0.5].min
        top = @s[:load_points].max
        slow, fast = [1 + k, 1 - k].map do |f|
          { max: sim.scaled(f).closed(threads).rps,
            p99: top && open_sim(workload, sim).scaled(f).open(threads, rate: top * max_rps, rng: Random.new(@s[:seed] + 1)).latency_p99 }
        end
        out = { samples: runs.size, mean_of: basis, run_mean_within: k.round(4),
                max_rps_range: [slow[:max].round(2), fast[:max].round(2)] }
        msg = format("from %s requests the mean GVL time per request is known to +-%.1f %% (95 %%): max req/s %.1f-%.1f",
                     grouped(basis), 100 * k, slow[:max], fast[:max])
        if top
          out[:load] = { load: top, rate: (top * max_rps).round(2), latency_p99_range: [fast[:p99].round(6), slow[:p99].round(6)] }
          msg += format(", p99 at %d %% load %.0f-%.0f ms", (100 * top).round, fast[:p99] * 1e3, slow[:p99] * 1e3)
        end
        @reasons << msg
        out
      end

      # What the window itself says at the running thread count, and the
      # model's figure for the same load (when the window's rate is known).
      def measured(sim, sweep)
        w = @window
        out = { threads: w.max_threads, stall_mean: w.mean(:stall)&.round(6), stall_p95: w.quantile(:stall, 0.95)&.round(6),
                pool_wait_mean: w.mean(:pool_wait)&.round(6), lock_mean: w.mean(:lock)&.round(6), wall_p50: w.quantile(:wall, 0.5)&.round(6),
                wall_p99: w.quantile(:wall, 0.99)&.round(6), rate: nil, loaded_rate: nil, predicted_stall_mean: nil }
        if w.seconds&.positive? && w.max_threads
          rate = w.rate_per_process
          out[:rate] = rate.round(2)
          out[:loaded_rate] = w.loaded_rate_per_process.round(2)
          if rate < sweep.at(w.max_threads).rps
            out[:predicted_stall_mean] = sim.open(w.max_threads, rate: rate, rng: Random.new(@s[:seed] + 3))
                                            .stall_mean.round(6)
          else
            @warnings << format("the window's rate (%.1f req/s) is above what the model gives %d threads " \
                                "(%.1f req/s): the measured figures and the model disagree", rate, w.max_threads,
                                sweep.at(w.max_threads).rps)
          end
        end
        out
      end

      def explain(r)
        g = r[:gvl_ceiling]
        g[:max_rps] && @reasons << format("the GVL caps one process at 1 / %.1f ms of run = %.1f req/s; Puma's rule would reach it " \
                           "at ceil(1 / %.2f) = %d threads with constant service times", 1e3 / g[:max_rps],
                           g[:max_rps], r[:cpu_share], g[:threads])
        @reasons << format("Amdahl's law with I/O share %.2f would stop at %d threads (< 5 %% gain after); it " \
                           "models one task, not independent requests", r[:amdahl][:io_share], r[:amdahl][:pick])
        m = r[:machine]
        @reasons << if m[:bound] == "memory"
                      format("%d processes: memory holds %d workers of %d MiB (%s), fewer than %s CPUs",
                             m[:processes], m[:by_memory], m[:worker_bytes] / 1_048_576, m[:memory_source], m[:cpus])
                    elsif m[:cpus]
                      format("%d processes: %s usable CPUs (%s)", m[:processes], m[:cpus], m[:cpu_source])
                    else
                      "1 process: the machine's CPUs are not known"
                    end
      end

      def self.threads_text(r) = Advice.threads_text(r)

      def grouped(n) = n.to_s.reverse.scan(/\d{1,3}/).join(",").reverse # 12400 -> "12,400"

      def summary(r)
        running = r[:running_threads] ? "; running #{r[:running_threads]} threads" : ""
        stall = r[:measured][:stall_p95] ? format(", stall p95 %.0f ms", r[:measured][:stall_p95] * 1e3) : ""
        format("advice: %s x %d processes (cpu share %.2f from %s requests%s%s)",
               Recommender.threads_text(r), r[:processes], r[:cpu_share], grouped(r[:requests]),
               running, stall)
      end
    end
  end
end
