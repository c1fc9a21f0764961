# frozen_string_literal: true

module Bench
  module Workloads
    # The background article's Unicorn-vs-Puma table: /simulated_io?delay=1
    # (a 1 s sleep) at concurrency 1, 5 and 100 against one process with 100
    # request slots (100 threads; Unicorn/Pitchfork 100 workers; Falcon one
    # process of fibers), all on one CPU. Reports req/s, latency percentiles,
    # a latency histogram and the memory of the whole process tree.
    class SimulatedIo < Workload
      register "simulated_io"

      def name = "simulated_io"
      def slots = Integer(ENV.fetch("BENCH_IO_SLOTS", "100"))
      def delay = Float(ENV.fetch("BENCH_IO_DELAY", "1"))
      def duration = Integer(ENV.fetch("BENCH_IO_DURATION", [ctx.duration * 2, 4].max.to_s))
      def concurrencies = ENV.fetch("BENCH_IO_CONCURRENCY", "1,5,100").split(",").map { |c| Integer(c) }
      def path = "/simulated_io?delay=#{delay.to_s.sub(/\.0\z/, '')}"

      def description
        "GET #{path} (a #{delay} s sleep), wrk -c #{concurrencies.join('/')} for #{duration}s each; " \
          "#{slots} request slots in one process on CPU #{ctx.server_cpu}"
      end

      def run(servers)
        results = {}
        servers.each do |server|
          ctx.log "#{name}: #{server.name} (#{server.layout(threads: slots)})"
          with_server(server, "simulated_io.ru", threads: slots) do |process|
            boot_kb = process.rss_kb
            runs = concurrencies.map { |c| measure(process, c) }
            results[server.name] = {
              "version" => server.version, "server_command" => process.command.join(" "),
              "layout" => server.layout(threads: slots), "processes" => Util.process_tree(process.pid).size,
              "boot_rss_mb" => (boot_kb / 1024.0).round(1), "runs" => runs
            }
          end
        end
        {
          "name" => name, "description" => description, "servers" => results,
          "ratio" => nil, "pick" => "one run per concurrency",
          "check" => { "target" => nil, "ok" => nil }
        }
      end

      def measure(process, conns)
        url = "http://127.0.0.1:#{process.port}#{path}"
        peak = { rss: 0, pss: 0 }
        sampler = Thread.new do
          loop do
            tree = Util.process_tree(process.pid)
            peak[:rss] = [peak[:rss], tree.sum { |p| Util.rss_kb(p) }].max
            peak[:pss] = [peak[:pss], tree.sum { |p| Util.pss_kb(p) }].max
            sleep 0.5
          end
        end
        figures = Wrk.run(ctx, url, duration: duration, connections: conns, timeout: delay * 10 + 2,
                                    script: Wrk.histogram_script, lenient: true)
        sampler.kill.join
        ctx.log format("  c=%<c>d %<rps>.1f req/s p50 %<p50>s p99 %<p99>s, RSS %<rss>.0f MB", c: conns, rps: figures["rps"],
                                                                                        p50: fmt_ms(figures["p50_ms"]), p99: fmt_ms(figures["p99_ms"]), rss: peak[:rss] / 1024.0)
        figures.reject { |k, _| k == "raw" }.merge(
          "concurrency" => conns, "rss_mb" => (peak[:rss] / 1024.0).round(1), "pss_mb" => (peak[:pss] / 1024.0).round(1),
          "errors" => figures["non_2xx"] + figures["socket_errors"].values.sum
        )
      ensure
        sampler&.kill
      end

      def table(result)
        servers = result["servers"]
        rows = [["server", "layout", "concurrency", "req/s", "vs serval", "p50", "p99", "max", "errors", "RSS (tree)", "PSS (tree)", "RSS vs serval"]]
        concurrencies.each do |c|
          servers.each do |sname, s|
            r = s["runs"].find { |x| x["concurrency"] == c } or next
            base = servers.dig("serval", "runs")&.find { |x| x["concurrency"] == c }
            rows << [sname, s["layout"], c.to_s, fmt_rps(r["rps"]), rel(r["rps"], base&.fetch("rps")),
                     fmt_ms(r["p50_ms"]), fmt_ms(r["p99_ms"]), fmt_ms(r["max_ms"]), r["errors"].to_s,
                     format("%.0f MB", r["rss_mb"]), format("%.0f MB", r["pss_mb"]), rel(r["rss_mb"], base&.fetch("rss_mb"))]
          end
        end
        notes = ["RSS: peak VmRSS summed over the process tree during the run (counts pages shared by forked workers once per " \
                 "worker, like the article's figure); PSS: the same with shared pages split"]
        servers.each do |sname, s|
          r = s["runs"].max_by { |x| x["concurrency"] }
          next unless r && r["histogram_ms"]

          notes << "#{sname} c=#{r['concurrency']} latency histogram (upper bound: count): " +
                   r["histogram_ms"].map { |u, n| "#{fmt_ms(u)}: #{n}" }.join(", ")
        end
        [rows, notes]
      end
    end
  end
end
