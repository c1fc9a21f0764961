# frozen_string_literal: true

module Bench
  module Workloads
    # N connections each ask for a 1 MiB body and never read it; meanwhile a
    # fresh client (a new connection per request) sends sequential GET / and
    # we record how long each takes. A server whose threads block writing to
    # the slow readers stalls the fresh client; one that parks the unsent
    # bytes in its event loop does not.
    class SlowReaders < Workload
      register "slow_readers"

      def name = "slow_readers"

      def slow_count = Integer(ENV.fetch("BENCH_SLOW_CONNECTIONS", "200"))
      def probes = Integer(ENV.fetch("BENCH_SLOW_PROBES", "50"))
      def probe_timeout = Float(ENV.fetch("BENCH_SLOW_PROBE_TIMEOUT", "5"))
      def interval = Float(ENV.fetch("BENCH_SLOW_INTERVAL", "0.05"))
      def settle = Float(ENV.fetch("BENCH_SLOW_SETTLE", "1"))
      def mss = Integer(ENV.fetch("BENCH_SLOW_MSS", "1460"))
      def give_up_after = 3 # consecutive failed probes
      def prompt = 1.0 # seconds: "promptly"
      def slow_path = "/1mb"
      def slow_bytes = 1 << 20

      def description
        "#{slow_count} connections (MSS #{mss.positive? ? mss : 'default'}) GET /1mb and never read; a fresh client sends #{probes} sequential GET / " \
          "(new connection each, #{probe_timeout}s timeout)"
      end

      def run(servers)
        results = {}
        servers.each do |server|
          ctx.log "#{name}: #{server.name}"
          with_server(server, "payload.ru", path: "/hello") do |process|
            check_body(process)
            results[server.name] = measure(process).merge(
              "version" => server.version, "server_command" => process.command.join(" ")
            )
          end
          s = results[server.name]
          ctx.log "  #{s['ok_prompt']}/#{s['probes']} got 200 within #{prompt}s, max #{fmt_ms(s['max_ms'])}"
        end
        summarize(results)
      end

      def check_body(process)
        res = HTTP.get("127.0.0.1", process.port, slow_path, timeout: 10)
        return if res.status == 200 && res.body.bytesize == slow_bytes

        raise Error, "#{process.server.name}: GET #{slow_path} -> #{res.status}, #{res.body.bytesize} bytes"
      end

      def measure(process)
        slow = []
        connected = 0
        slow_count.times do
          sock = slow_socket(process.port)
          slow << sock
          sock.write_nonblock("GET #{slow_path} HTTP/1.1\r\nHost: 127.0.0.1:#{process.port}\r\n\r\n", exception: false)
          connected += 1
        rescue SystemCallError
          next
        end
        sleep settle
        latencies = probe(process.port)
        ok = latencies.count { |l| l[:status] == 200 && l[:seconds] <= prompt }
        ok_any = latencies.count { |l| l[:status] == 200 }
        # A probe that failed, timed out or was skipped counts as probe_timeout.
        all = latencies.map { |l| l[:status] == 200 ? l[:seconds] : probe_timeout }
        all.fill(probe_timeout, all.size...probes)
        all.sort!
        {
          "slow_connections" => connected, "probes" => probes, "ok_prompt" => ok, "ok_any" => ok_any,
          "failed" => probes - ok_any, "skipped" => probes - latencies.size,
          "p50_ms" => ms(pct(all, 50)), "p99_ms" => ms(pct(all, 99)), "max_ms" => ms(all.last),
          "samples_ms" => latencies.map { |l| [l[:status], ms(l[:seconds])] }
        }
      ensure
        slow.each(&:close)
      end

      # Loopback's 64 KiB MTU lets the kernel grow the server's send buffer
      # until a whole 1 MiB response fits in it, and then nothing is slow. The
      # slow readers therefore advertise an Ethernet-sized MSS (TCP_MAXSEG
      # before connect), as a client across a real network would; the server's
      # send buffer then stays far below 1 MiB, which is the situation the
      # workload is about. BENCH_SLOW_MSS=0 keeps loopback's default.
      def slow_socket(port)
        sock = Socket.new(:INET, :STREAM)
        sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_MAXSEG, mss) if mss.positive?
        addr = Socket.sockaddr_in(port, "127.0.0.1")
        if sock.connect_nonblock(addr, exception: false) == :wait_writable
          raise Errno::ETIMEDOUT unless sock.wait_writable(5)

          sock.connect_nonblock(addr, exception: false)
        end
        sock
      rescue SystemCallError
        sock&.close
        raise
      end

      def probe(port)
        out = []
        failures_in_a_row = 0
        probes.times do
          started = Util.now
          begin
            res = HTTP.get("127.0.0.1", port, "/", timeout: probe_timeout)
            out << { status: res.status, seconds: res.seconds }
          rescue SystemCallError, HTTP::Timeout, IOError => e
            out << { status: e.class.name, seconds: Util.now - started }
          end
          failures_in_a_row = out.last[:status] == 200 ? 0 : failures_in_a_row + 1
          break if failures_in_a_row >= give_up_after

          sleep interval
        end
        out
      end

      def pct(sorted, pct)
        sorted[((sorted.size - 1) * pct / 100.0).round]
      end

      def ms(seconds)
        (seconds * 1000).round(2)
      end

      def summarize(results)
        s = results["serval"]
        {
          "name" => name, "description" => description, "servers" => results,
          "ratio" => ratio(results, "ok_prompt"),
          "ratio_text" => results.map { |n, r| "#{n} #{r['ok_prompt']}/#{r['probes']}" }.join(" vs ") + " within #{prompt}s",
          "check" => { "target" => "serval: every probe gets 200 within #{prompt}s",
                       "ok" => s && s["ok_prompt"] == s["probes"] }
        }
      end

      def table(result)
        rows = [["server", "version", "slow conns", "200 within #{prompt}s", "failed", "p50", "p99", "max"]]
        result["servers"].each do |sname, s|
          rows << [sname, s["version"], s["slow_connections"].to_s, "#{s['ok_prompt']}/#{s['probes']}",
                   s["failed"].to_s, fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]), fmt_ms(s["max_ms"])]
        end
        notes = ["a failed or skipped probe counts as #{probe_timeout}s in p50/p99/max; probing stops after " \
                 "#{give_up_after} failures in a row (the rest count as failed)"]
        notes << "target: #{result.dig('check', 'target')}"
        [rows, notes]
      end
    end
  end
end
