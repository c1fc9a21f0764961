# frozen_string_literal: true

module Bench
  module Workloads
    # GVL unfairness: an I/O-bound endpoint (6 blocking waits of 10 ms, 60 ms
    # in all: ~16.6 req/s for one client) measured alone, then while another
    # request burns CPU in another thread of the same process. Each time the
    # I/O request's thread wakes up it may wait up to the 100 ms GVL time
    # slice for the CPU-bound thread: the article's 16.6 -> 1.7 req/s drop.
    class Unfairness < Workload
      register "unfairness"

      def name = "unfairness"
      def duration = Integer(ENV.fetch("BENCH_UNFAIR_DURATION", ctx.duration.to_s))
      def io_path = "/io?n=6&ms=10"
      def threads = 2 # one for the I/O client, one for the CPU-bound request

      def description
        "GET #{io_path} (6 x 10 ms sleeps) with wrk -c1 -d#{duration}s, alone and while GET /cpu burns CPU in another " \
          "thread; one process, 2 threads (Unicorn/Pitchfork 2 workers), CPU #{ctx.server_cpu}"
      end

      def run(servers)
        results = {}
        servers.each do |server|
          ctx.log "#{name}: #{server.name}"
          with_server(server, "mixed.ru", threads: threads) do |process|
            url = "http://127.0.0.1:#{process.port}#{io_path}"
            alone = Wrk.run(ctx, url, duration: duration, connections: 1, timeout: duration + 5, lenient: true)
            busy = with_cpu_request(process) do
              Wrk.run(ctx, url, duration: duration, connections: 1, timeout: duration + 5, lenient: true)
            end
            results[server.name] = {
              "version" => server.version, "layout" => server.layout(threads: threads),
              "server_command" => process.command.join(" "), "wrk_command" => alone["command"],
              "alone_rps" => alone["rps"], "alone_p50_ms" => alone["p50_ms"], "alone_p99_ms" => alone["p99_ms"],
              "busy_rps" => busy["rps"], "busy_p50_ms" => busy["p50_ms"], "busy_p99_ms" => busy["p99_ms"],
              "drop" => busy["rps"].positive? ? (alone["rps"] / busy["rps"]).round(1) : nil
            }
            ctx.log format("  alone %<a>.1f req/s, with a CPU-bound request %<b>.1f req/s", a: alone["rps"], b: busy["rps"])
          end
        end
        {
          "name" => name, "description" => description, "servers" => results,
          "ratio" => nil, "pick" => "one run", "check" => { "target" => nil, "ok" => nil }
        }
      end

      # Run the block while GET /cpu burns CPU for longer than the block takes.
      def with_cpu_request(process)
        seconds = duration + 1
        cpu = Thread.new do
          HTTP.get("127.0.0.1", process.port, "/cpu?seconds=#{seconds}", timeout: seconds * 4 + 10)
        rescue StandardError => e
          e
        end
        sleep 0.3
        yield
      ensure
        cpu&.join(seconds * 4 + 15) || cpu&.kill
      end

      def table(result)
        s = result["servers"]
        rows = [["server", "layout", "I/O alone req/s", "p50", "with CPU request req/s", "p50", "p99", "drop", "busy vs serval"]]
        s.each do |sname, r|
          rows << [sname, r["layout"], fmt_rps(r["alone_rps"]), fmt_ms(r["alone_p50_ms"]), fmt_rps(r["busy_rps"]),
                   fmt_ms(r["busy_p50_ms"]), fmt_ms(r["busy_p99_ms"]), r["drop"] ? "#{r['drop']}x" : "all blocked",
                   rel(r["busy_rps"], s.dig("serval", "busy_rps"))]
        end
        [rows, ["article: 16.6 -> 1.7 req/s (a CPU-bound thread holds the GVL for its 100 ms time slice)"]]
      end
    end
  end
end
