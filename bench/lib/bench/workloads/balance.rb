# frozen_string_literal: true

module Bench
  module Workloads
    # Issue 10's balancing check: 2 workers x 4 threads, requests of mean
    # 20 ms with 70 % of it CPU (exponential, bench/apps/mixed_random.ru),
    # wrk with 4 keep-alive connections against 16. Four clients that all
    # land on one worker leave it GVL-bound while its sibling idles; the
    # figure is req/s at 4 connections / req/s at 16, per server, median of
    # rounds. Serval runs twice: --no-gvl-balance (before) and with it
    # (after); Puma in the same run.
    #
    # The servers are pinned to both CPUs (BENCH_BALANCE_CPUS, default all):
    # on one CPU the two workers share one core whatever the balance, and
    # the imbalance this measures cannot show. wrk (client CPU) shares a core
    # with the server; at ~150 req/s it takes a few percent of it.
    class Balance < Workload
      register "balance"

      def name = "balance"
      def ms = Float(ENV.fetch("BENCH_BALANCE_MS", "20"))
      def share = Float(ENV.fetch("BENCH_BALANCE_CPU", "0.7"))
      def rounds = Integer(ENV.fetch("BENCH_BALANCE_ROUNDS", [ctx.rounds, 3].max.to_s))
      def warmup = [ctx.warmup, 3].max # balancing moves a client after a second of imbalance
      def cpus = ENV.fetch("BENCH_BALANCE_CPUS", ctx.all_cpus)
      def path = "/work?ms=#{ms.round}&cpu=#{share}"
      def clients = [4, 16]
      def target = 0.9

      def description
        "2 workers x 4 threads, #{ms.round} ms requests, #{(share * 100).round} % CPU (exponential), " \
          "wrk -c4 vs -c16 keep-alive, #{ctx.duration}s each after #{warmup}s warm-up, servers on CPUs #{cpus}, " \
          "median of #{rounds} rounds"
      end

      # [label, server, extra flags]
      def variants(servers)
        servers.flat_map do |s|
          s.name == "serval" ? [["serval --no-gvl-balance", s, ["--no-gvl-balance"]], ["serval", s, []]] : [[s.name, s, []]]
        end
      end

      def run(servers)
        runs = Hash.new { |h, k| h[k] = [] }
        list = variants(servers)
        rounds.times do |round|
          order(list, round).each do |label, server, extra|
            ctx.log "#{name}: round #{round + 1}/#{rounds} #{label}"
            runs[label] << measure(server, extra)
          end
        end
        results = list.to_h { |label, server, _| [label, summarize(runs[label], server)] }
        serval = results["serval"]
        { "name" => name, "description" => description, "servers" => results,
          "check" => { "target" => "serval 4/16 >= #{target}",
                       "ok" => serval ? serval["ratio"] && serval["ratio"] >= target : nil } }
      end

      def measure(server, extra)
        process = ServerProcess.new(server, app: app_path("mixed_random.ru"), port: Util.free_port, threads: 4,
                                            workers: 2, cpus: cpus, extra: extra).start
        process.wait_ready(path: "/")
        url = "http://127.0.0.1:#{process.port}#{path}"
        clients.each_with_object({ "command" => process.command.join(" ") }) do |c, out|
          Wrk.run(ctx, url, duration: warmup, connections: c)
          f = Wrk.run(ctx, url, duration: ctx.duration, connections: c)
          ctx.log format("  -c%<c>d: %<r>.1f req/s p99 %<p>s", c: c, r: f["rps"], p: fmt_ms(f["p99_ms"]))
          out["rps_#{c}"] = f["rps"]
          out["p99_#{c}"] = f["p99_ms"]
          out["wrk_#{c}"] = f["command"]
        end
      ensure
        process&.stop
      end

      def summarize(list, server)
        rps4 = median(list.map { |r| r["rps_4"] })
        rps16 = median(list.map { |r| r["rps_16"] })
        ratios = list.map { |r| r["rps_4"] / r["rps_16"] }
        { "version" => server.version, "rps_4" => rps4, "rps_16" => rps16, "ratio" => median(ratios),
          "ratios" => ratios.map { |x| x.round(3) }, "p99_4_ms" => median(list.map { |r| r["p99_4"] }),
          "p99_16_ms" => median(list.map { |r| r["p99_16"] }), "server_command" => list.first["command"],
          "wrk_command" => list.first["wrk_4"] }
      end

      def median(values) = Util.median(values)

      def table(result)
        rows = [["server", "version", "req/s -c4", "req/s -c16", "4/16 (median of rounds)", "rounds", "p99 -c4", "p99 -c16"]]
        result["servers"].each do |label, s|
          rows << [label, s["version"], fmt_rps(s["rps_4"]), fmt_rps(s["rps_16"]), s["ratio"] ? format("%.3f", s["ratio"]) : "-",
                   s["ratios"].map { |x| format("%.2f", x) }.join(" "), fmt_ms(s["p99_4_ms"]), fmt_ms(s["p99_16_ms"])]
        end
        [rows, ["4/16 = req/s with 4 keep-alive connections / req/s with 16, each round on a fresh server"]]
      end

      # A server started with extra flags before the rackup file.
    end
  end
end
