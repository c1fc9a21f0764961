# frozen_string_literal: true

require "json"
require "fileutils"
require_relative "../advice_source"
require_relative "../advice_cases"

module Bench
  module Workloads
    # Issue #9's check of Serval's concurrency advice. Per CPU share (70, 35,
    # 20 and 10 %): requests of mean 20 ms with exponential CPU time and two
    # real socket round trips to a stand-in database (bench/apps/advice.ru,
    # bench/lib/bench/fake_db.rb); Serval runs at a middle thread count, is
    # asked for advice, then a closed-loop sweep over fixed thread counts
    # (wrk -c = threads, median of rounds) gives the knee and the best req/s;
    # at the advised threads the capacity is measured (wrk -c 2 x threads)
    # and open-loop runs (bench/lib/bench/open_loop.rb) at 50 % and 80 % of
    # it give the p99 to hold against the advice's p99 at 50 % and 80 % of
    # its own max req/s (#open_loop says why each side's own capacity).
    #
    # Besides the CPU shares (AdviceCases::Synthetic), the same check runs on
    # a mixed-route app and on examples/rails in production
    # (BENCH_ADVICE_CASES, "mixed,rails"; AdviceCases says what each is), and
    # for every workload `threads :auto`'s open-loop p99 is held against the
    # best fixed count's at the same arrivals (#auto_compare). --quick
    # (BENCH_QUICK=1): shares 70 and 35 %, one round, one load point (80 %),
    # shorter runs: the whole check in ~20 minutes.
    class Advice < Workload
      register "advice"

      DB_CPU_NOTE = "the stand-in database and both load generators run on the client CPU"

      def name = "advice"
      def quick? = ENV["BENCH_QUICK"] == "1"
      def request_ms = Float(ENV.fetch("BENCH_ADVICE_MS", "20"))
      def queries = Integer(ENV.fetch("BENCH_ADVICE_QUERIES", "2"))
      def shares = ENV.fetch("BENCH_ADVICE_SHARES", quick? ? "0.7,0.35" : "0.7,0.35,0.2,0.1").split(",").map { |s| Float(s) }

      # The workloads checked: the shares, then BENCH_ADVICE_CASES (mixed,
      # rails; "none" for the shares alone).
      def cases
        extra = ENV.fetch("BENCH_ADVICE_CASES", "mixed,rails").split(",").map(&:strip) - ["none", ""]
        extra.each { |c| raise Error, "BENCH_ADVICE_CASES: #{c} is not mixed or rails" unless %w[mixed rails].include?(c) }
        shares.map { |sh| AdviceCases::Synthetic.new(self, sh) } +
          extra.map { |c| c == "mixed" ? AdviceCases::Mixed.new(self) : AdviceCases::Rails.new(self) }
      end

      def as_case(kase) = kase.is_a?(Numeric) ? AdviceCases::Synthetic.new(self, kase) : kase

      # The open-loop load points measured (shares of the sweep's best
      # req/s): BENCH_ADVICE_LOADS, "0.5,0.8" (quick: "0.8").
      def loads = ENV.fetch("BENCH_ADVICE_LOADS", quick? ? "0.8" : "0.5,0.8").split(",").map { |v| Float(v) }
      # auto vs fixed: open-loop arrivals at this share of the best req/s
      def auto_load = Float(ENV.fetch("BENCH_ADVICE_AUTO_LOAD", "0.8"))
      def auto_check? = ENV.fetch("BENCH_ADVICE_AUTO", "1") != "0"
      def auto_warmup = Integer(ENV.fetch("BENCH_AUTO_WARMUP", "40"))
      # What runs in auto's place: "auto", or a fixed count as a control
      # (BENCH_ADVICE_AUTO_AS=13: the same slot, flags and control app).
      def auto_as = ENV.fetch("BENCH_ADVICE_AUTO_AS", "auto")
      # The thread count the advice is measured at: the middle of the share's
      # sweep (the issue's "a middle thread count"), or BENCH_ADVICE_WINDOW_THREADS.
      def window_threads(share)
        env = ENV["BENCH_ADVICE_WINDOW_THREADS"]
        env ? Integer(env) : (thread_counts(share).max / 2.0).ceil
      end
      def window_requests = Integer(ENV.fetch("BENCH_ADVICE_WINDOW_REQUESTS", quick? ? "1500" : "4000")) # or BENCH_ADVICE_WINDOW_DURATION s
      def window_max_seconds = Integer(ENV.fetch("BENCH_ADVICE_WINDOW_DURATION", "60"))
      def open_seconds = Integer(ENV.fetch("BENCH_ADVICE_OPEN_DURATION", quick? ? "15" : "20"))
      # The advised count's runs, against the model's p99: long enough that
      # the measured p99 is the long-run one the model gives. Near capacity
      # a 15 s run's p99 rests on one or two busy periods and reads about
      # 12 % under the long run's, one run from the next 0.7-1.3x (bench/NOTES.md
      # "Session 35"); the auto check's runs compare servers with each
      # other, at open_seconds.
      def p99_seconds = Integer(ENV.fetch("BENCH_ADVICE_P99_DURATION", "60"))
      def rounds = [ctx.rounds, Integer(ENV.fetch("BENCH_ADVICE_ROUNDS", quick? ? "1" : "2"))].max
      def sweep_seconds = quick? ? Integer(ENV.fetch("BENCH_DURATION", "3")) : ctx.duration
      def warmup = [ctx.warmup, 1].min
      def server_names = %w[serval]

      # Thread counts swept: well past where the GVL should saturate
      # (1 / share), at most 16 (the advice's own sweep).
      def thread_counts(share)
        max = ENV["BENCH_ADVICE_MAX_THREADS"]&.then { |v| Integer(v) } || ((1.6 / share).ceil + 3).clamp(6, 16)
        (1..max).to_a
      end

      def path(share) = "/work?ms=#{request_ms}&cpu=#{share}&q=#{queries}"
      # path(share) with its tagged draws stratified in blocks of `strata` (when tagged?)
      def stratified_path(share, strata) = "#{path(share)}#{"&st=#{strata}" if tagged?}"

      def description
        "#{cases.map(&:label).join(', ')} (#{request_ms.round} ms requests with exponential CPU and #{queries} round trips to a " \
          "stand-in database at each CPU share; the others below); " \
          "advice from Serval at #{cases.map(&:window_threads).join("/")} threads, then " \
          "sweep -c = threads (median of #{rounds}, #{sweep_seconds} s) and open-loop p99 (#{p99_seconds} s runs), " \
          "#{auto_check? ? "threads :auto against the best fixed count open loop at #{(auto_load * 100).round} % of the best req/s, " : ''}" \
          "server on CPU #{ctx.server_cpu}"
      end

      def run(servers)
        server = select(servers).first or return skipped
        db_path = File.join(ctx.scratch, "fake_db.sock")
        db = start_db(db_path)
        @windows = {}
        per_share = cases.map { |kase| run_case(server, kase, db_path) }
        measured = per_share.reject { |s| s["skipped"] }
        { "name" => name, "description" => description,
          "servers" => { "serval" => { "version" => server.version, "shares" => per_share } },
          "ratio" => nil, "pick" => "median of #{rounds} rounds per thread count",
          "check" => { "target" => "threads within 1 of the knee, max req/s within 10 %, p99 within 25 %" \
                                   "#{auto_check? ? '; auto open-loop p99 <= 1.1 x the best fixed count\'s' : ''}",
                       "ok" => measured.all? { |s| s["ok"] && (s["auto"].nil? || s["auto"]["ok"]) } } }
      ensure
        Util.stop(db) if db
      end

      def run_case(server, kase, db_path)
        reason = kase.respond_to?(:unavailable_reason) && kase.unavailable_reason
        if reason
          ctx.log "advice: #{kase.label}: not run: #{reason}"
          return { "case" => kase.key, "label" => kase.label, "skipped" => reason, "ok" => nil }
        end

        kase.setup
        measure_share(server, kase, db_path)
      ensure
        kase.teardown if kase && !reason
      end

      def skipped
        { "name" => name, "description" => description, "servers" => {}, "ratio" => nil,
          "check" => { "target" => nil, "ok" => nil } }
      end

      def start_db(path)
        log = File.join(ctx.scratch, "fake_db.log")
        pid = Util.spawn(ctx.pin_client([RbConfig.ruby, File.join(__dir__, "..", "fake_db.rb"), path]), out: log, err: log)
        deadline = Util.now + ctx.boot_timeout
        sleep 0.05 until File.socket?(path) || Util.now > deadline
        raise Error, "fake db did not start: #{File.read(log)}" unless File.socket?(path)

        pid
      end

      def measure_share(server, kase, db_path)
        advice = ask_advice(server, kase, db_path)
        counts = kase.thread_counts
        runs = Hash.new { |h, k| h[k] = [] }
        rounds.times do |round|
          (round.even? ? counts : counts.reverse).each { |t| runs[t] << closed(server, kase, db_path, t, round) }
        end
        sweep = counts.map do |t|
          list = runs[t]
          { "threads" => t, "rps" => median(list.map { |r| r["rps"] }), "p99_ms" => median(list.map { |r| r["p99_ms"] }),
            "rounds" => list.map { |r| r["rps"].round(1) }, "cpu_ms_per_request" => median(list.filter_map { |r| r["cpu_ms"] }),
            "model_rps" => advice.dig("sweep", t - 1, "rps") }
        end
        best = sweep.map { |r| r["rps"] }.max
        knee = sweep.find { |r| r["rps"] >= 0.95 * best }["threads"]
        open = advice["threads"] ? open_loop(server, kase, db_path, advice, best) : []
        out = summarize(kase, advice, sweep, best, knee, open)
        out["knee_cpu"] = self.class.knee_cpu(sweep)
        out["plateau_rps"] = self.class.plateau_median(sweep, knee)
        out["plateau_err"] = out["predicted_rps"] && out["plateau_rps"] ? (out["predicted_rps"] / out["plateau_rps"]) - 1 : nil
        out["auto"] = auto_compare(server, kase, db_path, advice, best, knee) if auto_check?
        out
      end

      # The knee of the server's CPU use rather than its req/s: each point's
      # req/s x its server CPU per request (the share of its CPU the server
      # used), fewest threads with 95 % of the highest. A point's req/s moves
      # with its CPU per request (other load on the server's CPU, a busy
      # sibling: 5.7-6.5 ms on mixed routes in one run, bench/NOTES.md "The
      # knee on mixed routes"); once the server is CPU-bound that noise is
      # all that separates the points, and the req/s knee lands anywhere on
      # the flat top. Reported beside the knee, not instead of it; nil
      # without CPU figures.
      def self.knee_cpu(sweep)
        busy = sweep.map { |r| r["cpu_ms_per_request"] && r["rps"] * r["cpu_ms_per_request"] / 1e3 }
        return nil if busy.any?(&:nil?) || busy.empty?

        top = busy.max
        sweep[busy.index { |b| b >= 0.95 * top }]["threads"]
      end

      # The median req/s of the sweep's rows from the knee up: past the
      # knee every row measures the same flat top, each with the machine's
      # noise (examples/rails: one process's CPU per request moved 1.57-2.17
      # ms between 3 s segments, bench/NOTES.md "Session 29"), and the best
      # row is the largest of those draws, so it reads high by about the
      # noise. Reported beside the best, not instead of it; nil without rows.
      def self.plateau_median(sweep, knee) = Util.median(sweep.select { |r| r["threads"] >= knee }.map { |r| r["rps"] })

      def summarize(kase, advice, sweep, best, knee, open)
        share = kase.label
        threads = advice["threads"]
        rps_err = threads && (advice["max_rps_per_process"] / best) - 1
        p99_ok = open.all? { |o| o["p99_err"] && o["p99_err"].abs <= 0.25 }
        ok = threads && (threads - knee).abs <= 1 && rps_err.abs <= 0.10 && p99_ok && !open.empty?
        own_ok = !open.empty? && open.all? { |o| o["own_p99_err"] && o["own_p99_err"].abs <= 0.25 }
        ctx.log format("advice: %s advised %s knee %d predicted %.1f best %.1f", share, threads.inspect, knee,
                       advice["max_rps_per_process"].to_f, best)
        { "share" => kase.respond_to?(:share) ? kase.share : nil, "case" => kase.key, "label" => kase.label,
          "description" => kase.description, "advice" => advice.slice("source", "threads", "knee", "knee_99", "p99_threads", "cpu_share", "max_rps_per_process",
                                                     "requests", "warnings", "workload", "stall", "measured",
                                                     "cpu_steadiness", "precision", "lock"),
          "advised_threads" => threads, "knee" => knee, "best_rps" => best, "predicted_rps" => advice["max_rps_per_process"],
          "rps_err" => rps_err, "sweep" => sweep, "open_loop" => open, "ok" => ok ? true : false,
          "own_p99_ok" => own_ok }
      end

      # Serval at the window's thread count under load, then its advice.
      def ask_advice(server, kase, db_path)
        control_port = Util.free_port
        token = AdviceSource.token
        threads = kase.window_threads
        proc = kase.start(server, threads, db_path, extra: AdviceSource.server_flags(control_port, token, log: AdviceSource.log?))
        seconds = 0
        # Load in 5 s steps until the window holds enough requests (the
        # advice wants 1,000, and its precision grows with the samples, up to
        # 3,072 in a minute; 70 % CPU at 3 threads serves ~70 req/s).
        # Tagged too (each request pays what the sweep's and the open-loop
        # runs' do: Random.new(N)), from a base of its own each run and not
        # stratified: the window samples iid requests, as a real app's does.
        # Each 5 s step starts 10^6 tags further on.
        base = (200 + rand(100_000)) * 10_000_000
        if kase.window_warmup.positive?
          target = kase.wrk_target(proc.port, base: base + 9_000_000)
          Wrk.run(ctx, target[:url], duration: kase.window_warmup, connections: threads, **target[:opts])
        end
        while seconds < window_max_seconds && counted(proc, control_port, token) < window_requests
          target = kase.wrk_target(proc.port, base: base + (seconds * 200_000))
          Wrk.run(ctx, target[:url], duration: 5, connections: threads, **target[:opts])
          seconds += 5
        end
        advice = AdviceSource.fetch(control_port: control_port, token: token, log_path: proc.log_path,
                                    threads: threads, seconds: seconds)
        @windows[kase.key] = AdviceSource.window(control_port, token)
        save_window(kase.key)
        advice
      ensure
        proc&.stop
      end

      # With BENCH_ADVICE_WINDOWS=DIR the advice's window is kept as
      # DIR/window-SHARE.json, to replay other versions of the model on it
      # against this run's sweep.
      def save_window(share)
        dir = ENV["BENCH_ADVICE_WINDOWS"]
        return unless dir && @windows[share]

        FileUtils.mkdir_p(dir)
        File.write(File.join(dir, "window-#{share}.json"), JSON.generate(@windows[share]))
      end

      # With BENCH_ADVICE_WINDOWS=DIR an open-loop run's window is kept too,
      # as DIR/open-SHARE-tTHREADS-sSEED.json, with the run's rate and
      # measured latencies (sorted, ms) beside it: the model's tail from a
      # run's own window against that run's, percentile by percentile
      # (bench/NOTES.md "Session 35").
      def save_open_window(window, share, threads, seed, rate, run)
        dir = ENV["BENCH_ADVICE_WINDOWS"]
        return unless dir && window

        FileUtils.mkdir_p(dir)
        File.write(File.join(dir, "open-#{share}-t#{threads}-s#{seed}.json"),
                   JSON.generate("window" => window, "rate" => rate, "threads" => threads, "seed" => seed,
                                 "p99_ms" => run["p99_ms"], "latencies_ms" => run["latencies_ms"]))
      end

      # /work requests the advice will rest on: the server's window, or its
      # access log when the advice comes from the log.
      def counted(proc, control_port, token)
        return File.read(proc.log_path).scan("GET /work").size if AdviceSource.log?

        AdviceSource.window_requests(control_port, token) || 0
      end

      # The sweep's work is tagged (BENCH_ADVICE_TAGGED, on by default): in
      # round k every thread count serves the same sequence of requests (wrk
      # -s tagged.lua, r = SWEEP_TAG_BASE x (k + 1) + 1, 2, ...; the warm-up
      # serves the sequence's start once more), and each round another one.
      # Untagged, a 4 s point at 70 % CPU serves ~270 requests whose mean
      # CPU time is off its expectation by 6 % (exponential draws), and the
      # sweep's best is the luckiest thread count's draw: session 12's
      # sweeps read 69.7 req/s at 3 threads and 65-67 at 4-6, each point's
      # rounds within 1 % of each other (the app seeded a thread's Random
      # from its object_id, the same in every process). Tagged draws are
      # also stratified in blocks of SWEEP_STRATA (bench/apps/advice.ru
      # Draws: still exponential, but 260 requests' mean CPU strays ~1.2 %
      # from its expectation instead of ~5 %), so that a point measures the
      # workload's capacity and not its sample's.
      #
      # Open-loop runs (open_loop.rb --tag, seeds 1, 2, 3) are stratified in
      # blocks of OPEN_STRATA: iid, the three seeds' 2,000 first requests
      # ask for 5.3 % and 2.9 % less and 1.1 % more CPU than expected, which
      # at 80 % load moves p99 by a quarter; in blocks of 1,024 they are
      # within 1.3 %. Blocks that long leave the short runs of long requests
      # that make a tail as they are (a stretch of 50 requests keeps 95 % of
      # its iid variance), where blocks of 32 would thin them out.
      SWEEP_TAG_BASE = 100 * 10_000_000
      SWEEP_STRATA = 32
      OPEN_STRATA = 1024

      def tagged? = ENV.fetch("BENCH_ADVICE_TAGGED", "1") != "0"

      def closed(server, kase, db_path, threads, round = 0)
        with_db_server(server, db_path, threads, kase: kase) do |proc|
          target = kase.wrk_target(proc.port, base: SWEEP_TAG_BASE * (round + 1), strata: tagged? ? SWEEP_STRATA : nil)
          Wrk.run(ctx, target[:url], duration: kase.sweep_warmup, connections: threads, **target[:opts])
          cpu0 = proc.cpu_seconds
          f = Wrk.run(ctx, target[:url], duration: sweep_seconds, connections: threads, **target[:opts])
          cpu1 = proc.cpu_seconds
          # the server's CPU (user + system, every thread) per request: does
          # a request cost more CPU at more threads? (bench/NOTES.md "Run
          # time can grow with threads")
          cpu_ms = cpu0 && cpu1 && f["requests"].to_i.positive? ? (cpu1 - cpu0) * 1e3 / f["requests"] : nil
          ctx.log format("advice: %s threads %d: %.1f req/s p99 %s, server CPU %s ms/request", kase.label, threads, f["rps"],
                         fmt_ms(f["p99_ms"]), cpu_ms ? format("%.2f", cpu_ms) : "-")
          { "rps" => f["rps"], "p99_ms" => f["p99_ms"], "cpu_ms" => cpu_ms, "command" => f["command"] }
        end
      end

      # Open-loop p99 at 50 % and 80 % of capacity, the model's against the
      # server's, at the same arrival rate. The rate is the load point's share
      # of a capacity chosen by BENCH_ADVICE_LOAD_BASIS:
      #
      #   best       the sweep's best median req/s (the issue's "best
      #              measured"; the default since 2026-11-26). The model's p99
      #              is recomputed from the advice's own window at exactly that
      #              rate (Advice.recommend with load_points = rate / its max).
      #   measured   the capacity measured again at the advised threads (wrk
      #              -c 2 x threads, #measured_capacity); the model at the same
      #              share of *its* max. Two different rates: a 5 % gap
      #              between the two capacity figures moves p99 at 80 % by a
      #              third, and one wrk run's capacity swung 64.7-69.4 req/s
      #              (70 % CPU, 2026-11-25), so this compared different loads.
      #   predicted  both at the advice's own rates (share of the model's max):
      #              the capacity error is charged to p99 a second time.
      #
      # `rounds` runs per rate (a fresh server and another arrival seed
      # each); the p99 is taken over the runs' latencies pooled (one run's
      # p99 at 80 % load rests on a few congestion episodes), the median of
      # the runs' p99s is kept beside it.
      #
      # A run whose load generator fell behind its schedule (more than
      # LATE_MAX of its requests sent over 10 ms late) did not measure the
      # server alone: the generator and the stand-in database share the
      # client CPU, and when the machine stalls both do (this VM stops both
      # CPUs for up to a second now and then). Such runs are kept in
      # `p99_all_runs_ms` and `behind`, and left out of the pooled p99 while
      # a run on schedule remains.
      LATE_MAX = 0.01

      def self.on_schedule?(run) = run["late"].to_i <= LATE_MAX * [run["sent"].to_i, 1].max

      def on_schedule?(run) = self.class.on_schedule?(run)

      def open_loop(server, kase, db_path, advice, best)
        share = kase.label
        threads = advice["threads"]
        capacity = case load_basis
                   when "measured" then measured_capacity(server, kase, db_path, threads)
                   when "best" then { "rps" => best, "source" => "the sweep's best median req/s" }
                   end
        Array(advice["load"]).select { |point| loads.any? { |l| (l - point["load"].to_f).abs < 1e-6 } }.map do |point|
          rate = capacity ? point["load"] * capacity["rps"] : point["rate"]
          requested = point["load"]
          if load_basis == "best"
            point = model_at(kase, advice, rate) or
              raise Error, "no window to recompute the model's p99 at #{rate.round(1)} req/s (GET /window failed)"
          end
          runs = Array.new(rounds) { |round| open_run(server, kase, db_path, threads, rate, round + 1, p99_seconds) }
          predicted = point["latency_p99"] * 1e3
          kept = runs.select { |m| on_schedule?(m) }
          kept = runs if kept.empty?
          pooled = kept.flat_map { |m| m["latencies_ms"] }.sort
          all_p99 = Util.percentile(runs.flat_map { |m| m["latencies_ms"] }.sort, 0.99)
          owns = runs.filter_map { |m| m["own"] && m["own"]["p99_ms"] }
          # the model from each run's own window against the same runs, both
          # as the mean of the runs' p99s (one prediction per run)
          own_p99 = owns.size == runs.size ? owns.sum / owns.size : nil
          run_mean = runs.sum { |m| m["p99_ms"].to_f } / runs.size
          p99 = Util.percentile(pooled, 0.99)
          p50 = Util.percentile(pooled, 0.5)
          ctx.log format("advice: %s open loop %.1f req/s (%s) at %d threads: p99 %.1f ms pooled, runs %s, late %s " \
                         "(predicted %.1f at %.1f req/s)",
                         share, rate, load_basis, threads, p99.to_f, runs.map { |m| m["p99_ms"].to_f.round(1) }.inspect,
                         runs.map { |m| m["late"].to_i }.inspect, predicted, point["rate"])
          { "load" => requested, "model_load" => point["load"], "rate" => rate.round(2), "predicted_rate" => point["rate"], "basis" => load_basis,
            "capacity" => capacity, "threads" => threads, "model_threads" => point["model_threads"] || threads,
            "predicted_p50_ms" => point["latency_p50"] * 1e3, "predicted_p99_ms" => predicted,
            "p50_ms" => p50, "p99_ms" => p99, "p99_runs_ms" => runs.map { |m| m["p99_ms"] },
            "p99_median_of_runs_ms" => median(runs.map { |m| m["p99_ms"] }),
            "p99_all_runs_ms" => all_p99, "behind" => runs.each_index.reject { |i| on_schedule?(runs[i]) }.map { |i| i + 1 },
            "late_runs" => runs.map { |m| m["late"].to_i },
            "completed" => runs.sum { |m| m["completed"].to_i }, "errors" => runs.sum { |m| m["errors"].to_i },
            "late" => runs.sum { |m| m["late"].to_i }, "p99_err" => p99 && ((predicted / p99) - 1),
            "own_predicted_p99_ms" => own_p99, "own_measured_p99_ms" => own_p99 && run_mean,
            "own_p99_err" => own_p99 && ((own_p99 / run_mean) - 1),
            "own" => runs.map { |m| m["own"] },
            "command" => runs.first["command"] }
        end
      end

      # best (the default), measured or predicted: see #open_loop.
      def load_basis
        v = ENV.fetch("BENCH_ADVICE_LOAD_BASIS", "best")
        unless %w[best measured predicted].include?(v)
          raise Error, "BENCH_ADVICE_LOAD_BASIS is best, measured or predicted, not #{v.inspect}"
        end

        v
      end

      # The model's open-loop point at `rate` req/s from the window the advice
      # came from (the recommender's own load points are shares of its max
      # req/s; this asks for the share that is `rate`). The machine is the
      # server's: one CPU (taskset). nil without a window.
      # The window read after /advice may have lost a bucket, so the model
      # is asked first for its max on this window and then at rate / max.
      def model_at(kase, advice, rate)
        share = kase.key
        window = @windows[share] or return nil
        machine = { cpus: 1.0, cpu_source: "taskset -c #{ctx.server_cpu}" }
        @model_max ||= {}
        max = @model_max[share] ||= Serval::Advice.recommend(window, machine: machine, load_points: [],
                                                                     precision: false)[:max_rps_per_process]
        again = Serval::Advice.recommend(window, machine: machine, load_points: [rate / max], precision: false)
        unless again[:threads] == advice["threads"]
          ctx.log format("advice: %s the window read after /advice gives %s threads (the advice %s); p99 at %.1f req/s " \
                         "is the model's at %s", share, again[:threads].inspect, advice["threads"].inspect, rate,
                         again[:threads].inspect)
        end
        JSON.parse(JSON.generate(again[:load].first)).merge("model_threads" => again[:threads], "model_max_rps" => max)
      end

      def basis_note
        case load_basis
        when "best" then "at #{loads.map { |l| "#{(l * 100).round} %" }.join(' and ')} of the sweep's best median req/s, the model's p99 at the same rates (from the advice's window)"
        when "measured" then "at 50 % and 80 % of the capacity measured there (wrk -c 2 x threads), the model's at 50 % and 80 % of its own max"
        else "at 50 % and 80 % of the model's max req/s, the model's p99 at the same rates"
        end
      end

      def capacity_seconds = Integer(ENV.fetch("BENCH_ADVICE_CAPACITY_DURATION", "10"))

      # The advised thread count's capacity: closed loop with twice as many
      # clients as threads, so a request is always waiting for a thread (the
      # saturated rate an open-loop queue sees), `rounds` runs on fresh
      # servers, the mean req/s.
      def measured_capacity(server, kase, db_path, threads)
        share = kase.label
        runs = Array.new(rounds) do |i|
          with_db_server(server, db_path, threads, kase: kase) do |proc|
            target = kase.wrk_target(proc.port, base: 7 * SWEEP_TAG_BASE + (i * 10_000_000))
            Wrk.run(ctx, target[:url], duration: kase.sweep_warmup, connections: 2 * threads, **target[:opts])
            Wrk.run(ctx, target[:url], duration: capacity_seconds, connections: 2 * threads, **target[:opts])
          end
        end
        rps = runs.sum { |r| r["rps"] } / runs.size
        ctx.log format("advice: %s capacity at %d threads (wrk -c %d): %.1f req/s of %s", share, threads,
                       2 * threads, rps, runs.map { |r| r["rps"].round(1) }.inspect)
        { "rps" => rps.round(2), "runs" => runs.map { |r| r["rps"] }, "connections" => 2 * threads,
          "command" => runs.first["command"] }
      end

      # One open-loop run on a fresh server, and the model's p50 / p99 at the
      # run's rate from the window that server recorded during the run
      # (control app GET /window at its end): the model given the requests
      # as this process ran them. The advice's own prediction comes from
      # another process minutes earlier, and on this machine one process's
      # mean run time differs from the next one's by up to 10 % (13.7 /
      # 15.2 ms at 70 % CPU, 2026-11-26), which near capacity moves p99 by
      # half: `own_*` separates the model's error from that drift.
      def open_run(server, kase, db_path, threads, rate, seed, seconds = open_seconds)
        kase = as_case(kase)
        share = kase.label
        control_port = Util.free_port
        token = AdviceSource.token
        extra = ["--control-url", "tcp://127.0.0.1:#{control_port}", "--control-token", token]
        with_db_server(server, db_path, threads, extra: extra, kase: kase) do |proc|
          argv = ctx.pin_client([RbConfig.ruby, File.join(__dir__, "..", "open_loop.rb"), *kase.open_args(proc.port, strata: OPEN_STRATA),
                                 "--rate", rate.round(3).to_s, "--duration", seconds.to_s, "--warmup", kase.open_warmup.to_s,
                                 "--seed", seed.to_s, "--latencies"])
          status, out, timed_out = Util.capture(argv, timeout: seconds + 60)
          raise Error, "open_loop failed: #{out}" if timed_out || !status&.success?

          run = JSON.parse(out.lines.last).merge("command" => argv.join(" ").gsub(/127\.0\.0\.1:\d+/, "127.0.0.1:PORT"))
          window = AdviceSource.window(control_port, token)
          save_open_window(window, kase.key, threads, seed, rate, run)
          own = own_prediction(window, rate)
          ctx.log format("advice: %s run %d at %.1f req/s: p99 %.1f ms; the model from this run's window: %s", share,
                         seed, rate, run["p99_ms"].to_f, own ? format("p99 %.1f ms (max %.1f req/s)", own["p99_ms"], own["max_rps"]) : "-")
          run.merge("own" => own)
        end
      end

      # The model's open-loop point at `rate` from one run's window (the
      # threads the run had; CPU as the bench pins it). nil without a window.
      # A 20 s run at half load on 70 % CPU holds ~770 requests, under the
      # advice's 1,000: the check asks for OWN_MIN_REQUESTS.
      OWN_MIN_REQUESTS = 300

      def own_prediction(window, rate)
        return nil unless window && window["requests"].to_i.positive?

        machine = { cpus: 1.0, cpu_source: "taskset -c #{ctx.server_cpu}" }
        opts = { machine: machine, min_requests: OWN_MIN_REQUESTS, precision: false }
        max = Serval::Advice.recommend(window, load_points: [], **opts)[:max_rps_per_process]
        return nil unless max&.positive?

        point = Serval::Advice.recommend(window, load_points: [rate / max], **opts)[:load]&.first
        point && { "p50_ms" => point[:latency_p50] * 1e3, "p99_ms" => point[:latency_p99] * 1e3, "max_rps" => max,
                   "load" => rate / max, "cpu_speed_steps" => Array(window["cpu_speed"]).size }
      rescue ArgumentError
        nil
      end

      # A server on the case's app (kase nil: bench/apps/advice.ru, as `auto` asks).
      def with_db_server(server, db_path, threads, extra: [], kase: nil)
        proc = start_db_server(server, db_path, threads, extra: extra, kase: kase)
        yield proc
      ensure
        proc&.stop
      end

      def start_db_server(server, db_path, threads, extra: [], kase: nil)
        return kase.start(server, threads, db_path, extra: extra) if kase

        proc = AdviceServer.new(server, app: app_path("advice.ru"), port: Util.free_port, threads: threads,
                                db: db_path, extra: extra).start
        begin
          proc.wait_ready(path: "/")
        rescue StandardError
          proc.stop
          raise
        end
        proc
      end

      def median(list) = Util.median(list)

      def pct(err) = err ? format("%+.0f %%", err * 100) : "-"

      # threads :auto against fixed counts, open loop at auto_load x the
      # sweep's best req/s (issue 32: auto's p99 <= 1.1 x the best fixed
      # count's). The fixed counts tried: the knee, one more, and the advised
      # count (the lowest p99 at 80 % load was at or above the knee in every
      # `bench/run auto` so far; fewer threads queue). Each server, fixed or
      # auto, gets the same treatment: auto_warmup s of the same arrivals
      # (not counted; auto moves its count meanwhile), then `rounds` runs of
      # open_seconds with arrival seeds 1.., alternated between the servers
      # (#open_compare), p99 of each server's latencies pooled.
      #
      # The rate must be one the best fixed count sustains open loop, or the
      # comparison is between overloads (session 21, Rails: 80 % of the
      # closed-loop sweep's best, wrk -c = threads, was above what any count
      # served with open arrivals from 64 connections, and every p99 was
      # seconds of backlog). So when the best fixed count did not keep up
      # (#sustained?), the rate becomes auto_load x the open-loop capacity:
      # the most any fixed count answered a second in those overloaded runs
      # (goodput: a server behind its schedule serves all it can), and the
      # fixed counts are measured again at it; `rate_basis` says which.
      def auto_compare(server, kase, db_path, advice, best, knee)
        rate = (auto_load * best).round(2)
        counts = [knee, knee + 1, advice["threads"]].compact.select(&:positive?).uniq.sort
        fixed, auto = open_compare(server, kase, db_path, counts, rate, auto: true)
        best_fixed = fixed.min_by { |f| f["p99_ms"] || Float::INFINITY }
        basis = format("%.0f %% of the closed-loop sweep's best (%.1f req/s)", auto_load * 100, best)
        overloaded = nil
        unless best_fixed["sustained"]
          capacity = fixed.map { |f| f["goodput_rps"].to_f }.max
          overloaded = { "rate" => rate, "fixed" => fixed, "auto" => auto, "capacity_rps" => capacity }
          rate = (auto_load * capacity).round(2)
          basis = format("%.0f %% of the open-loop capacity (%.1f req/s: the best goodput of the fixed counts at %.1f " \
                         "req/s, which the best of them did not sustain)", auto_load * 100, capacity, overloaded["rate"])
          ctx.log "advice: #{kase.label}: no fixed count kept up open loop at #{overloaded['rate']} req/s; again at #{rate} (#{basis})"
          # auto again too: its runs alternate with the fixed counts'
          fixed, auto = open_compare(server, kase, db_path, counts, rate, auto: true)
          best_fixed = fixed.min_by { |f| f["p99_ms"] || Float::INFINITY }
        end
        ratio = auto["p99_ms"] && best_fixed["p99_ms"] ? auto["p99_ms"] / best_fixed["p99_ms"] : nil
        paired = self.class.paired_ratios(auto["runs_p99_ms"], fixed.map { |f| f["runs_p99_ms"] })
        ctx.log format("advice: %s auto open %.1f req/s: p99 %.1f ms at %s threads; best fixed %d: %.1f ms (%.2f x); " \
                       "per seed, auto over the best fixed count on that seed: %s%s", kase.label,
                       rate, auto["p99_ms"].to_f, auto["threads"].inspect, best_fixed["threads"], best_fixed["p99_ms"].to_f, ratio.to_f,
                       paired.map { |r| r ? format("%.2f", r) : "-" }.join(", "),
                       best_fixed["sustained"] ? "" : " - the best fixed count did not sustain this rate either")
        { "load" => auto_load, "rate" => rate, "rate_basis" => basis, "overloaded" => overloaded, "warmup" => auto_warmup,
          "fixed" => fixed, "best_fixed" => best_fixed, "sustained" => best_fixed["sustained"],
          "auto" => auto, "ratio" => ratio, "paired_ratios" => paired, "paired_median" => Util.percentile(paired.compact.sort, 0.5),
          "ok" => ratio && best_fixed["sustained"] ? ratio <= 1.1 : false }
      end

      # Per arrival seed: auto's p99 in its run with that seed over the
      # lowest p99 any fixed count had with the same seed. Run i of every
      # server replays the same arrival schedule (seed i + 1), so a bursty
      # seed raises both sides; the pooled ratio is set by the burstiest
      # seed (bench/NOTES.md "Session 28"). Reported beside the pooled
      # ratio, not instead of it. nil for a seed some side has no p99 for.
      def self.paired_ratios(auto_runs, fixed_runs)
        Array(auto_runs).each_with_index.map do |a, i|
          best = fixed_runs.map { |runs| Array(runs)[i] }
          next nil if a.nil? || best.empty? || best.any?(&:nil?)

          a / best.min
        end
      end

      # GOODPUT_MIN: a count keeps up when it answers at least this share of
      # the schedule's rate (counted requests over the run, answered over
      # the span to the last answer; a run at 80 % load ends within a p99 of
      # its schedule) with no more than LATE_MAX of its sends late (all
      # connections busy: the server's backlog holds 64 requests).
      GOODPUT_MIN = 0.95

      def self.sustained?(runs)
        runs.all? do |m|
          scheduled = m["counted"].to_f / m["duration"].to_f
          on_schedule?(m) && m["goodput_rps"].to_f >= GOODPUT_MIN * scheduled
        end
      end

      # Every server of a comparison (the fixed counts, then auto if asked)
      # runs at once, idle but for its own runs, and their runs alternate:
      # run i (arrival seed i + 1) goes through the servers in the order
      # rotated by i, so no server is always first or last and each seed's
      # runs are minutes apart at most. A server's warm-up (auto_warmup s
      # of the arrivals, seed 0, not counted) comes right before its first
      # run. (Before session 32 each server ran alone, auto's last, four
      # minutes after the fixed counts': bench/NOTES.md "Session 32".)
      def open_compare(server, kase, db_path, counts, rate, auto: false)
        servers = counts.map { |t| { "threads" => t } }
        servers << { "auto" => true } if auto
        servers.each do |s|
          extra = []
          if s["auto"]
            s["control"] = [Util.free_port, AdviceSource.token]
            extra = ["--control-url", "tcp://127.0.0.1:#{s['control'][0]}", "--control-token", s["control"][1]]
          end
          s["proc"] = start_db_server(server, db_path, s["auto"] ? auto_as : s["threads"], kase: kase, extra: extra)
          s["runs"] = []
          s["per_run"] = []
        end
        self.class.rotations(servers.size, rounds).each_with_index do |order, i|
          order.each do |k|
            s = servers[k]
            if i.zero?
              open_run_on(s["proc"], kase, rate, auto_warmup, 0, latencies: false) if auto_warmup.positive?
              s["warmed"] = auto_stats(s) if s["auto"]
            end
            s["runs"] << open_run_on(s["proc"], kase, rate, open_seconds, i + 1)
            s["per_run"] << auto_stats(s)&.dig("target_threads") if s["auto"]
          end
        end
        fixed = servers.reject { |s| s["auto"] }.map { |s| fixed_result(kase, s["threads"], rate, s["runs"]) }
        [fixed, auto ? auto_result(kase, servers.last) : nil]
      ensure
        servers&.each { |s| s["proc"]&.stop }
      end

      # rounds orders of n servers: order i is 0...n rotated by i.
      def self.rotations(n, rounds) = Array.new(rounds) { |i| (0...n).to_a.rotate(i) }

      def auto_stats(s)
        port, token = s["control"]
        res = HTTP.get("127.0.0.1", port, "/stats?token=#{token}", timeout: 10)
        res.status == 200 ? JSON.parse(res.body)["auto"] : nil
      rescue SystemCallError, IOError, JSON::ParserError, HTTP::Timeout
        nil
      end

      def fixed_result(kase, t, rate, runs)
        p99 = pooled_percentile(runs, 0.99)
        sustained = self.class.sustained?(runs)
        goodput = runs.sum { |m| m["goodput_rps"].to_f } / runs.size
        ctx.log format("advice: %s fixed %d threads open %.1f req/s: p99 %.1f ms (runs %s), goodput %.1f req/s%s", kase.label, t,
                       rate, p99.to_f, runs.map { |m| m["p99_ms"].to_f.round(1) }.inspect, goodput, sustained ? "" : ", behind")
        { "threads" => t, "p99_ms" => p99, "p50_ms" => pooled_percentile(runs, 0.5), "runs_p99_ms" => runs.map { |m| m["p99_ms"] },
          "late" => runs.map { |m| m["late"].to_i }, "errors" => runs.sum { |m| m["errors"].to_i },
          "goodput_rps" => goodput.round(2), "sustained" => sustained }
      end

      # Auto's count after its warm-up and after each run, its changes in
      # the measured runs (`moved`: it had not settled) and its `threads:`
      # log lines.
      def auto_result(kase, s)
        runs = s["runs"]
        warmed = s["warmed"]
        lines = File.readlines(s["proc"].log_path).grep(/threads: \d+ -> \d+/).map(&:strip)
        a = auto_stats(s)
        moved = a && warmed ? a["changes"].to_i - warmed["changes"].to_i : nil
        ctx.log format("advice: %s auto: p99 runs %s, threads %s after the warm-up, %s after each run (%s changes in " \
                       "the runs); %d changes: %s", kase.label, runs.map { |m| m["p99_ms"].to_f.round(1) }.inspect,
                       warmed&.dig("target_threads").inspect, s["per_run"].inspect, moved.inspect, lines.size,
                       lines.last(3).join(" | "))
        { "p99_ms" => pooled_percentile(runs, 0.99), "p50_ms" => pooled_percentile(runs, 0.5),
          "runs_p99_ms" => runs.map { |m| m["p99_ms"] }, "threads" => a&.dig("target_threads"),
          "threads_after_warmup" => warmed&.dig("target_threads"), "threads_per_run" => s["per_run"],
          "moved" => moved, "model_threads" => a&.dig("model_threads"), "model_open_threads" => a&.dig("model_open_threads"),
          "model_runs" => a&.dig("model_runs"),
          "reason" => a&.dig("reason"), "log" => lines, "late" => runs.map { |m| m["late"].to_i },
          "errors" => runs.sum { |m| m["errors"].to_i } }
      end

      def open_run_on(proc, kase, rate, seconds, seed, latencies: true)
        argv = ctx.pin_client([RbConfig.ruby, File.join(__dir__, "..", "open_loop.rb"), *kase.open_args(proc.port, strata: OPEN_STRATA),
                               "--rate", rate.to_s, "--duration", seconds.to_s, "--warmup", "0",
                               "--seed", seed.to_s, *("--latencies" if latencies), *series_args(proc, seed)])
        status, out, timed_out = Util.capture(argv, timeout: seconds + 60)
        raise Error, "open_loop failed: #{out}" if timed_out || !status&.success?

        JSON.parse(out.lines.last)
      end

      # BENCH_SERIES=1: each open-loop run also writes its requests' times
      # and latencies (open_loop.rb --series) into the scratch directory
      # (kept with BENCH_KEEP_LOGS), named by port, seed and start time.
      def series_args(proc, seed)
        return [] unless ENV["BENCH_SERIES"] == "1"

        ["--series", File.join(ctx.scratch, format("series-%d-%d-%d.txt", proc.port, seed, Time.now.to_i))]
      end

      def pooled_percentile(runs, p) = Util.percentile(runs.flat_map { |m| m["latencies_ms"] }.sort, p)

      # One row per workload: the advice against the sweep, the model's
      # open-loop p99 against the measured one, auto against the best fixed.
      def table(result)
        cases = result.dig("servers", "serval", "shares").to_a
        load_cols = cases.flat_map { |s| Array(s["open_loop"]).map { |o| o["load"] } }.uniq.sort
        rows = [["workload", "CPU share read", "advised threads", "knee", "predicted req/s", "best req/s", "err",
                 *load_cols.flat_map { |l| ["p99 @#{(l * 100).round} % pred / meas", "err"] },
                 "auto p99 / best fixed p99", "auto / best", "ok"]]
        notes = []
        cases.each do |s|
          label = s["label"] || "#{(s['share'] * 100).round} % CPU"
          if s["skipped"]
            rows << [label, "not run: #{s['skipped']}", *Array.new(rows.first.size - 2, "-")]
            next
          end
          a = s["advice"]
          p99_cells = load_cols.flat_map do |l|
            o = Array(s["open_loop"]).find { |x| x["load"] == l }
            o ? [format("%.0f / %.0f ms", o["predicted_p99_ms"], o["p99_ms"].to_f), pct(o["p99_err"])] : ["-", "-"]
          end
          au = s["auto"]
          auto_cell = if au
                        format("%.0f ms (at %s) / %.0f ms (%d)", au["auto"]["p99_ms"].to_f, au["auto"]["threads"].inspect,
                               au["best_fixed"]["p99_ms"].to_f, au["best_fixed"]["threads"])
                      else
                        "-"
                      end
          ok = s["ok"] && (au.nil? || au["ok"])
          rows << [label, a["cpu_share"] ? format("%.2f", a["cpu_share"]) : "-", s["advised_threads"].inspect, s["knee"].to_s,
                   fmt_rps(s["predicted_rps"]), fmt_rps(s["best_rps"]), pct(s["rps_err"]), *p99_cells, auto_cell,
                   au && au["ratio"] ? format("%.2f", au["ratio"]) : "-", ok ? "yes" : "no"]
          notes << "#{label}: #{s['description']}" if s["description"]
          if (st = a["cpu_steadiness"])
            notes << format("%s CPU steadiness in the advice's window (the model replays it open loop): %d busy " \
                            "0.25 s steps, %.0f %% below 90 %% speed, p10 %.2f, slowest %.2f", label,
                            st["steps"], st["below_0_9"] * 100, st["p10"], st["min"])
          end
          Array(s["open_loop"]).each do |o|
            if o["own_p99_err"]
              notes << format("%s at %.0f %% load: the model from the runs' own windows %.0f / %.0f ms %s", label, o["load"] * 100,
                              o["own_predicted_p99_ms"], o["own_measured_p99_ms"], pct(o["own_p99_err"]))
            end
            next if o["behind"].to_a.empty?

            notes << format("%s at %.0f %% load: run(s) %s fell behind the schedule (late %s of ~%d each; the " \
                            "machine or the client CPU stalled) and are left out of the pooled p99: %.0f ms with them",
                            label, o["load"] * 100, o["behind"].join(", "), o["late_runs"].inspect,
                            o["completed"].to_i / [o["late_runs"].to_a.size, 1].max, o["p99_all_runs_ms"].to_f)
          end
          if s["plateau_rps"]
            notes << format("%s the sweep's rows from the knee up: median %.1f req/s, predicted %s", label, s["plateau_rps"],
                            pct(s["plateau_err"]))
          end
          notes << "#{label} sweep (threads: measured median / model req/s): " +
                   s["sweep"].map { |r| format("%d: %s / %s", r["threads"], fmt_rps(r["rps"]), fmt_rps(r["model_rps"])) }.join(", ")
          if s["sweep"].any? { |r| r["cpu_ms_per_request"] }
            notes << "#{label} server CPU per request (ms, user + system, threads: ms): " +
                     s["sweep"].map { |r| format("%d: %s", r["threads"], r["cpu_ms_per_request"] ? format("%.2f", r["cpu_ms_per_request"]) : "-") }.join(", ")
            notes << format("%s knee of the server's CPU use (req/s x CPU per request, 95 %% of the highest): %s threads " \
                            "(req/s knee %d); the advice's 99 %% point %s, its lowest-p99 count at %s %% load %s", label,
                            s["knee_cpu"].inspect, s["knee"], a["knee_99"].inspect,
                            a.dig("p99_threads", "load")&.then { |l| (l * 100).round }.inspect, a.dig("p99_threads", "threads").inspect)
          end
          next unless au

          if (o = au["overloaded"])
            notes << format("%s open loop at %.1f req/s: no fixed count kept up (p99 %s; goodput %s req/s)", label, o["rate"],
                            o["fixed"].map { |f| format("%d: %.0f ms", f["threads"], f["p99_ms"].to_f) }.join(", "),
                            o["fixed"].map { |f| format("%d: %.1f", f["threads"], f["goodput_rps"].to_f) }.join(", "))
          end
          notes << format("%s open loop at %.1f req/s (%s), p99 fixed: %s%s; auto: %s threads after the warm-up, %s after " \
                          "the run(s)%s, changes: %s%s", label, au["rate"], au["rate_basis"] || "#{(au['load'] * 100).round} % of best",
                          au["fixed"].map { |f| format("%d: %.0f ms", f["threads"], f["p99_ms"].to_f) }.join(", "),
                          au["sustained"] == false ? " (the best fixed count did not keep up: the ratio compares overloads)" : "",
                          au["auto"]["threads_after_warmup"].inspect, au["auto"]["threads_per_run"].inspect,
                          au["auto"]["moved"].to_i.positive? ? format(" (%d change(s) in the measured run(s): not settled)", au["auto"]["moved"]) : "",
                          au["auto"]["log"].last(4).join(" | "),
                          au["paired_ratios"] ? format("; per seed, auto over the best fixed count on that seed: %s (median %s)",
                                                       au["paired_ratios"].map { |r| r ? format("%.2f", r) : "-" }.join(", "),
                                                       au["paired_median"] ? format("%.2f", au["paired_median"]) : "-") : "")
        end
        notes << "knee = fewest threads with >= 95 % of the sweep's best median req/s (wrk -c = threads); err = predicted / measured - 1; " \
                 "p99 measured open loop (Poisson arrivals, latency from the scheduled send time, #{rounds} run(s) pooled) at the advised threads, " \
                 "#{basis_note}"
        notes << "auto / best: threads :auto's open-loop p99 over the best fixed count's (of the knee, knee + 1 and the advised count), " \
                 "each server after #{auto_warmup} s of the same arrivals (a run of its own before the measured ones), " \
                 "#{rounds} run(s) of #{open_seconds} s pooled, at a rate the best fixed count keeps up with (else #{(auto_load * 100).round} % of the " \
                 "open-loop capacity, measured as the fixed counts' goodput behind the schedule)"
        notes << "advice from: #{cases.find { |c| c['advice'] }&.dig('advice', 'source')}; #{DB_CPU_NOTE} (CPU #{ctx.client_cpu}); " \
                 "PostgreSQL pinned there too for the Rails app"
        [rows, notes]
      end
    end

    # Serval with extra flags and the stand-in database's socket in its
    # environment (FAKE_DB_SOCKET, read by bench/apps/advice.ru).
    class AdviceServer < ServerProcess
      def initialize(server, app:, port:, threads:, db:, extra: [])
        super(server, app: app, port: port, threads: threads, extra: extra, env: { "FAKE_DB_SOCKET" => db })
      end
    end
  end
end
