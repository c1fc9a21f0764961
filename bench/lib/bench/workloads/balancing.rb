# frozen_string_literal: true

module Bench
  module Workloads
    # 2 workers x 1 thread. One client keeps sending GET /slow (200 ms each,
    # back to back, a new connection each), so one worker is nearly always
    # busy; a second client sends GET /fast every 20 ms (new connection each)
    # and records its latency. A server that routes requests to the worker
    # with a free thread answers every fast request at once; one that lets the
    # busy worker accept makes some fast requests wait up to 200 ms.
    class Balancing < Workload
      register "balancing"

      def name = "balancing"
      def duration = Float(ENV.fetch("BENCH_BALANCING_DURATION", "10"))
      def interval = 0.02
      def waited_ms = 50.0 # a fast request slower than this waited behind a slow one

      def description
        "2 workers x 1 thread; one client streams GET /slow (200 ms) back to back, another sends GET /fast " \
          "every #{(interval * 1000).round} ms for #{duration.round}s (new connection per request)"
      end

      def run(servers)
        results = {}
        servers.each do |server|
          ctx.log "#{name}: #{server.name}"
          process = server.start(app: app_path("balancing.ru"), port: Util.free_port, threads: 1, workers: 2,
                                 cpus: ctx.all_cpus)
          begin
            process.wait_ready(path: "/fast")
            sleep 1 # every worker booted
            results[server.name] = measure(process.port).merge(
              "version" => server.version, "server_command" => process.command.join(" ")
            )
          ensure
            process.stop
          end
          s = results[server.name]
          ctx.log "  fast p50 #{fmt_ms(s['p50_ms'])} p99 #{fmt_ms(s['p99_ms'])} max #{fmt_ms(s['max_ms'])}, " \
                  "#{s['waited']}/#{s['fast']} waited > #{waited_ms.round} ms"
        end
        { "name" => name, "description" => description, "servers" => results,
          "check" => { "target" => "serval fast p99 < puma fast p99",
                       "ok" => results["serval"] && results["puma"] &&
                               results["serval"]["p99_ms"] < results["puma"]["p99_ms"] } }
      end

      def measure(port)
        stop = false
        slow_count = 0
        slow = Thread.new do
          until stop
            HTTP.get("127.0.0.1", port, "/slow", timeout: 10)
            slow_count += 1
          end
        end
        sleep 0.3
        latencies = []
        errors = 0
        deadline = Util.now + duration
        while Util.now < deadline
          started = Util.now
          begin
            res = HTTP.get("127.0.0.1", port, "/fast", timeout: 5)
            res.status == 200 ? latencies << (Util.now - started) * 1000 : errors += 1
          rescue StandardError
            errors += 1
          end
          pause = interval - (Util.now - started)
          sleep pause if pause.positive?
        end
        stop = true
        slow.join(10)
        sorted = latencies.sort
        { "fast" => latencies.size, "slow" => slow_count, "errors" => errors,
          "waited" => latencies.count { |l| l > waited_ms },
          "p50_ms" => pct(sorted, 50), "p99_ms" => pct(sorted, 99), "max_ms" => sorted.last }
      end

      def pct(sorted, p)
        return nil if sorted.empty?

        sorted[[(sorted.size * p / 100.0).ceil - 1, 0].max]
      end

      def table(result)
        rows = [%w[server version fast p50 p99 max waited>50ms slow errors]]
        result["servers"].each do |sname, s|
          rows << [sname, s["version"], s["fast"].to_s, fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]), fmt_ms(s["max_ms"]),
                   s["waited"].to_s, s["slow"].to_s, s["errors"].to_s]
        end
        [rows, ["fast = GET /fast latency; waited = fast requests that took > #{waited_ms.round} ms"]]
      end
    end
  end
end
