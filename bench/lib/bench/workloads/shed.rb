# frozen_string_literal: true

require "json"

module Bench
  module Workloads
    # Issue #10's load shedding check. Requests of 10 ms CPU each
    # (bench/apps/mixed.ru /work?ms=10&cpu=1) on one process with
    # ctx.threads threads: first its capacity, closed loop (wrk -c 2 x
    # threads); then open-loop Poisson arrivals (bench/lib/bench/open_loop.rb)
    # at twice that rate, once without and once with --max-queue-time, fresh
    # server each, alternating which goes first, median of rounds.
    # Reported: the accepted (200) requests' p99, the 503s' p99 and goodput
    # (200s a second) as a share of capacity.
    class Shed < Workload
      register "shed"

      def name = "shed"
      def budget = Float(ENV.fetch("BENCH_SHED_BUDGET", "0.05"))
      def load_factor = Float(ENV.fetch("BENCH_SHED_LOAD", "2"))
      def open_seconds = Integer(ENV.fetch("BENCH_SHED_DURATION", "10"))
      def rounds = [ctx.rounds, Integer(ENV.fetch("BENCH_SHED_ROUNDS", "3"))].max
      def path = "/work?ms=10&cpu=1"
      def server_names = %w[serval]

      TARGET = { "p99_ms" => 300.0, "shed_p99_ms" => 20.0, "goodput" => 0.85 }.freeze

      def description
        "10 ms CPU per request, #{ctx.threads} threads, server on CPU #{ctx.server_cpu}: capacity closed loop, " \
          "then open-loop Poisson arrivals at #{load_factor}x capacity for #{open_seconds}s, without and with " \
          "--max-queue-time #{budget} (median of #{rounds} rounds)"
      end

      def run(servers)
        server = select(servers).first or return skipped
        runs = Hash.new { |h, k| h[k] = [] }
        capacities = []
        rounds.times do |round|
          capacity = measure_capacity(server)
          capacities << capacity
          modes = round.even? ? %w[off on] : %w[on off]
          modes.each { |mode| runs[mode] << open_run(server, mode, capacity * load_factor, round + 1, capacity) }
        end
        capacity = median(capacities)
        modes = runs.to_h { |mode, list| [mode, summarize(mode, list)] }
        on = modes["on"]
        ok = on["p99_ms"].to_f <= TARGET["p99_ms"] && on["shed_p99_ms"].to_f <= TARGET["shed_p99_ms"] &&
             on["goodput"].to_f >= TARGET["goodput"]
        { "name" => name, "description" => description,
          "servers" => { "serval" => { "version" => server.version, "capacity_rps" => capacity,
                                       "capacity_rounds" => capacities, "modes" => modes } },
          "ratio" => nil, "pick" => "median of #{rounds} rounds",
          "check" => { "target" => "with max_queue_time #{budget}: accepted p99 <= #{TARGET['p99_ms'].round} ms, " \
                                   "503 p99 <= #{TARGET['shed_p99_ms'].round} ms, goodput >= #{(TARGET['goodput'] * 100).round} % of capacity",
                       "ok" => ok } }
      end

      def skipped
        { "name" => name, "description" => description, "servers" => {}, "ratio" => nil,
          "check" => { "target" => nil, "ok" => nil } }
      end

      def measure_capacity(server)
        with_shed_server(server, []) do |proc|
          url = "http://127.0.0.1:#{proc.port}#{path}"
          Wrk.run(ctx, url, duration: ctx.warmup, connections: ctx.threads * 2) if ctx.warmup.positive?
          f = Wrk.run(ctx, url, duration: ctx.duration, connections: ctx.threads * 2)
          ctx.log format("shed: capacity %.1f req/s (p99 %s)", f["rps"], fmt_ms(f["p99_ms"]))
          @capacity_command = f["command"].gsub(/127\.0\.0\.1:\d+/, "127.0.0.1:PORT")
          f["rps"]
        end
      end

      def open_run(server, mode, rate, seed, capacity)
        extra = mode == "on" ? ["--max-queue-time", budget.to_s] : []
        with_shed_server(server, extra) do |proc|
          url = "http://127.0.0.1:#{proc.port}#{path}"
          argv = ctx.pin_client([RbConfig.ruby, File.join(__dir__, "..", "open_loop.rb"), "--url", url,
                                 "--rate", rate.round(1).to_s, "--duration", open_seconds.to_s, "--warmup", "2",
                                 "--seed", seed.to_s])
          status, out, timed_out = Util.capture(argv, timeout: (open_seconds * load_factor * 2) + 120)
          raise Error, "open_loop failed: #{out}" if timed_out || !status&.success?

          m = JSON.parse(out.lines.last)
          m["goodput"] = m["goodput_rps"] / capacity
          m["command"] = argv.join(" ").gsub(/127\.0\.0\.1:\d+/, "127.0.0.1:PORT")
          m["server_command"] = proc.command.join(" ").gsub(/127\.0\.0\.1:\d+/, "127.0.0.1:PORT")
          ctx.log format("shed: %-3s %.0f req/s offered: 200s %d (%.1f/s, %.0f %% of capacity) p99 %s, 503s %d p99 %s, errors %d",
                         mode, rate, m["completed"], m["goodput_rps"], m["goodput"] * 100, fmt_ms(m["p99_ms"]),
                         m["shed"], fmt_ms(m["shed_p99_ms"]), m["errors"])
          m
        end
      end

      def summarize(mode, list)
        keys = %w[p50_ms p99_ms max_ms shed_p50_ms shed_p99_ms goodput_rps goodput elapsed]
        out = keys.to_h { |k| [k, median(list.map { |m| m[k] })] }
        out.merge("mode" => mode, "rounds" => list.map { |m| m.slice(*keys, "completed", "shed", "errors", "late", "rate") },
                  "command" => list.first["command"], "server_command" => list.first["server_command"],
                  "capacity_command" => @capacity_command)
      end

      def with_shed_server(server, extra)
        proc = ServerProcess.new(server, app: app_path("mixed.ru"), port: Util.free_port, threads: ctx.threads,
                                      extra: extra).start
        proc.wait_ready(path: "/")
        yield proc
      ensure
        proc&.stop
      end

      def median(list) = Util.median(list)

      def table(result)
        s = result.dig("servers", "serval") or return [[["-"]], []]
        rows = [["max_queue_time", "offered req/s", "200s/s", "goodput (of capacity)", "accepted p50", "accepted p99",
                 "503s", "503 p99", "rounds (accepted p99 / 503 p99 / goodput)"]]
        %w[off on].each do |mode|
          m = s.dig("modes", mode) or next
          rows << [mode == "on" ? "#{budget} s" : "off", fmt_rps(m["rounds"].first["rate"]), fmt_rps(m["goodput_rps"]),
                   format("%.0f %%", m["goodput"].to_f * 100), fmt_ms(m["p50_ms"]), fmt_ms(m["p99_ms"]),
                   m["rounds"].sum { |r| r["shed"].to_i }.to_s, fmt_ms(m["shed_p99_ms"]),
                   m["rounds"].map { |r| "#{fmt_ms(r['p99_ms'])} / #{fmt_ms(r['shed_p99_ms'])} / #{(r['goodput'].to_f * 100).round} %" }.join(", ")]
        end
        notes = ["capacity #{fmt_rps(s['capacity_rps'])} req/s (median of #{s['capacity_rounds'].map { |c| fmt_rps(c) }.join(', ')}): " \
                 "#{s.dig('modes', 'on', 'capacity_command')}",
                 "open loop: #{s.dig('modes', 'on', 'command')}",
                 "target: #{result.dig('check', 'target')}: #{result.dig('check', 'ok') ? 'met' : 'NOT met'}"]
        [rows, notes]
      end
    end

  end
end
