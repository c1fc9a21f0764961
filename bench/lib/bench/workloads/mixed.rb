# frozen_string_literal: true

module Bench
  module Workloads
    # Puma's sleep_fibonacci experiment: a 20 ms request that computes for 70 %
    # (and, separately, 35 %) of it and sleeps for the rest, one process with
    # 1..6 threads and as many wrk connections. With one GVL the process can
    # not exceed 1 / (0.020 x CPU share) req/s: 71 and 143.
    class Mixed < Workload
      register "mixed"

      def name = "mixed"
      def request_ms = 20
      def shares = ENV.fetch("BENCH_MIXED_SHARES", "0.7,0.35").split(",").map { |s| Float(s) }
      def thread_counts = (1..Integer(ENV.fetch("BENCH_MIXED_MAX_THREADS", "6"))).to_a
      def duration = Integer(ENV.fetch("BENCH_MIXED_DURATION", ctx.duration.to_s))
      def warmup = [ctx.warmup, 1].min
      # Thread-pool servers only: the thread count is the variable here.
      def server_names = %w[serval puma]

      def ceiling(share) = 1.0 / (request_ms / 1000.0 * share)

      def description
        "#{request_ms} ms requests, CPU share #{shares.map { |s| "#{(s * 100).round} %" }.join(' and ')} (the rest sleeping), " \
          "one process with #{thread_counts.first}..#{thread_counts.last} threads, wrk -c <threads> -d#{duration}s, CPU #{ctx.server_cpu}"
      end

      def run(servers)
        servers = select(servers)
        results = {}
        servers.each do |server|
          runs = []
          shares.each do |share|
            thread_counts.each do |threads|
              runs << measure(server, share, threads)
            end
          end
          results[server.name] = { "version" => server.version, "runs" => runs }
        end
        {
          "name" => name, "description" => description, "servers" => results,
          "ceilings" => shares.to_h { |s| [s.to_s, ceiling(s).round(1)] },
          "ratio" => nil, "pick" => "one run per point", "check" => { "target" => nil, "ok" => nil }
        }
      end

      def measure(server, share, threads)
        path = "/work?ms=#{request_ms}&cpu=#{share}"
        with_server(server, "mixed.ru", threads: threads) do |process|
          url = "http://127.0.0.1:#{process.port}#{path}"
          Wrk.run(ctx, url, duration: warmup, connections: threads) if warmup.positive?
          f = Wrk.run(ctx, url, duration: duration, connections: threads)
          ctx.log format("#{name}: %<s>s cpu %<share>.2f threads %<t>d: %<rps>.1f req/s p50 %<p50>s p99 %<p99>s",
                         s: server.name, share: share, t: threads, rps: f["rps"], p50: fmt_ms(f["p50_ms"]), p99: fmt_ms(f["p99_ms"]))
          { "share" => share, "threads" => threads, "rps" => f["rps"], "p50_ms" => f["p50_ms"], "p99_ms" => f["p99_ms"],
            "errors" => f["non_2xx"] + f["socket_errors"].values.sum, "wrk_command" => f["command"],
            "server_command" => process.command.join(" ") }
        end
      end

      def table(result)
        names = result["servers"].keys
        rows = [["CPU share", "threads", "ceiling"] + names.flat_map { |n| ["#{n} req/s", "p50", "p99"] } +
                names.drop(1).map { |n| "#{n} vs serval" }]
        shares.each do |share|
          thread_counts.each do |t|
            cells = names.map { |n| result["servers"][n]["runs"].find { |r| r["share"] == share && r["threads"] == t } }
            row = ["#{(share * 100).round} %", t.to_s, format("%.0f", ceiling(share))]
            cells.each { |r| row.concat(r ? [fmt_rps(r["rps"]), fmt_ms(r["p50_ms"]), fmt_ms(r["p99_ms"])] : %w[- - -]) }
            base = cells[names.index("serval") || 0]
            cells.each_with_index { |r, i| row << rel(r&.fetch("rps"), base&.fetch("rps")) unless i.zero? }
            rows << row
          end
        end
        notes = ["ceiling = 1 / (0.020 s x CPU share): one GVL per process; minimum threads to reach it = ceil(1 / CPU share)",
                 "Unicorn/Pitchfork (no threads) and Falcon (fibers) are not in this table: the thread count is the variable"]
        [rows, notes]
      end
    end
  end
end
