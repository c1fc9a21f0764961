# frozen_string_literal: true

module Bench
  module Workloads
    # Many connections (issue 12): hello world over keep-alive at 16, 1,000
    # and 5,000 wrk connections (req/s, p99, server CPU per request), then, on
    # a fresh server, 10,000 idle keep-alive connections (each sent one
    # request and read its answer): the server's RSS growth per connection.
    # Serval, Iodine and Puma run the hello app with 1 process x 4 threads;
    # nginx (`return 200`, one worker) is the limit line. The soft and hard
    # RLIMIT_NOFILE of the harness (and so of wrk and the servers it starts)
    # are raised to fit; servers with a connection cap get it raised too
    # (Serval --max-connections, nginx worker_connections).
    class Connections < Workload
      register "connections"

      def name = "connections"
      # serval-notiming (timing off) measures what timing costs in the same
      # run; serval-base (BENCH_SERVAL_BASE) is another build for a
      # before/after rotation, skipped when the variable is not set.
      def server_names = %w[serval serval-notiming serval-base iodine puma nginx]
      def limit_line? = true

      def levels = ENV.fetch("BENCH_CONN_LEVELS", "16,1000,5000").split(",").map { |c| Integer(c) }
      def idle_count = Integer(ENV.fetch("BENCH_CONN_IDLE", "10000"))
      def settle = Float(ENV.fetch("BENCH_CONN_SETTLE", "1"))
      def cap = [levels.max, idle_count].max + 1024
      def nofile = cap + 4096 # per process: the harness holds the idle clients, the server their peers

      # wrk threads per level: one (wrk is pinned to one CPU) until 1,000
      # connections, then BENCH_CONN_WRK_THREADS (2).
      def wrk_threads(conns) = conns >= 1000 ? Integer(ENV.fetch("BENCH_CONN_WRK_THREADS", "2")) : 1

      def description
        "hello keep-alive at #{levels.join('/')} wrk connections (one process x #{ctx.threads} threads on CPU " \
          "#{ctx.server_cpu}; nginx: 1 worker, return 200), then RSS per idle keep-alive connection with " \
          "#{idle_count} open"
      end

      def run(servers)
        servers = select(servers)
        raise_nofile
        rounds = Hash.new { |h, k| h[k] = [] }
        meta = {}
        ctx.rounds.times do |round|
          order(servers, round).each do |server|
            ctx.log "#{name}: round #{round + 1}/#{ctx.rounds} #{server.name}"
            rounds[server.name] << measure(server, meta)
          end
        end
        summarize(rounds, meta)
      end

      # Soft RLIMIT_NOFILE up to nofile (the hard limit too when allowed: root
      # with CAP_SYS_RESOURCE); fails when even the hard limit is too low.
      def raise_nofile
        soft, hard = Process.getrlimit(:NOFILE)
        return if soft >= nofile

        begin
          Process.setrlimit(:NOFILE, nofile, [nofile, hard].max)
        rescue Errno::EPERM
          Process.setrlimit(:NOFILE, hard, hard)
        end
        now = Process.getrlimit(:NOFILE).first
        ctx.log "#{name}: RLIMIT_NOFILE #{soft} -> #{now}"
        raise Error, "#{name}: needs #{nofile} open files per process, the hard limit is #{hard} (ulimit -Hn)" if now < cap + 64
      end

      def measure(server, meta)
        figures = { "levels" => {} }
        with_server(server, "hello.ru", max_connections: cap) do |process|
          check_hello(process)
          meta[server.name] ||= { "version" => server.version, "server_command" => process.command.join(" "),
                                  "layout" => server.layout(threads: ctx.threads), "wrk_commands" => {} }
          levels.each do |conns|
            level = load_level(process, conns)
            command = level.delete("command")
            meta[server.name]["wrk_commands"][conns.to_s] ||= command
            meta[server.name]["wrk_command"] = command
            figures["levels"][conns.to_s] = level
            ctx.log format("  c=%<c>d: %<rps>.0f req/s  p99 %<p99>s  errors %<e>d", c: conns, rps: level["rps"],
                                                                                  p99: fmt_ms(level["p99_ms"]), e: level["errors"])
          end
        end
        with_server(server, "hello.ru", max_connections: cap) do |process|
          figures["idle"] = idle(process)
          ctx.log format("  %<n>d idle connections: %<kb>.1f KB each (RSS %<a>d -> %<b>d kB, %<open>d still open)",
                         n: figures["idle"]["opened"], kb: figures["idle"]["kb_per_connection"] || -1,
                         a: figures["idle"]["rss_before_kb"], b: figures["idle"]["rss_after_kb"],
                         open: figures["idle"]["still_open"])
        end
        figures
      end

      def check_hello(process)
        res = HTTP.get("127.0.0.1", process.port, "/", timeout: 5)
        return if res.status == 200 && res.body == "Hello World"

        raise Error, "#{process.server.name}: GET / -> #{res.status} #{res.body.bytesize} bytes, expected Hello World"
      end

      def load_level(process, conns)
        url = "http://127.0.0.1:#{process.port}/"
        opts = { duration: ctx.duration, connections: conns, threads: wrk_threads(conns), lenient: true }
        Wrk.run(ctx, url, **opts.merge(duration: ctx.warmup)) if ctx.warmup.positive?
        cpu0 = process.cpu_seconds
        r = Wrk.run(ctx, url, **opts)
        cpu1 = process.cpu_seconds
        level = { "rps" => r["rps"], "p50_ms" => r["p50_ms"], "p99_ms" => r["p99_ms"], "requests" => r["requests"],
                  "errors" => r["non_2xx"] + r["socket_errors"].values.sum, "socket_errors" => r["socket_errors"],
                  "command" => r["command"] }
        level["cpu_us_per_request"] = ((cpu1 - cpu0) * 1e6 / r["requests"]).round(2) if cpu0 && cpu1 && r["requests"].positive?
        level
      end

      # RSS of the server's process tree after boot and one request, then with
      # idle_count idle keep-alive connections open (each answered once).
      def idle(process)
        HTTP.get("127.0.0.1", process.port, "/", timeout: 5)
        sleep 0.5
        before = process.rss_kb
        clients = IdleClients.new("127.0.0.1", process.port)
        begin
          opened = clients.open(idle_count)
          sleep settle
          after = process.rss_kb
          still = clients.still_open
        ensure
          clients.close
        end
        {
          "opened" => opened, "still_open" => still, "failures" => clients.failures,
          "rss_before_kb" => before, "rss_after_kb" => after,
          "kb_per_connection" => opened.positive? ? ((after - before).to_f / opened).round(2) : nil
        }
      end

      def summarize(rounds, meta)
        results = {}
        rounds.each do |sname, list|
          s = meta[sname].merge("levels" => {}, "rounds" => list)
          levels.each do |c|
            per = list.map { |r| r.dig("levels", c.to_s) }.compact
            s["levels"][c.to_s] = {
              "rps" => median(per.map { |r| r["rps"] }), "p99_ms" => median(per.map { |r| r["p99_ms"] }),
              "cpu_us_per_request" => median(per.map { |r| r["cpu_us_per_request"] }),
              "errors" => per.sum { |r| r["errors"] }
            }
          end
          idle = list.map { |r| r["idle"] }
          s["idle_kb_per_connection"] = median(idle.map { |r| r["kb_per_connection"] })
          s["idle_opened"] = idle.map { |r| r["opened"] }.min
          s["idle_still_open"] = idle.map { |r| r["still_open"] }.min
          results[sname] = s
        end
        checks = targets(results)
        {
          "name" => name, "description" => description, "servers" => results,
          "pick" => "medians of #{ctx.rounds} round(s)", "targets" => checks,
          "ratio" => ratio_at(results, levels.first, "iodine"),
          "ratio_text" => "serval/iodine c=#{levels.first}: #{ratio_at(results, levels.first, 'iodine') || 'n/a'}",
          "check" => { "target" => "issue 12: " + checks.map { |c| c["target"] }.join("; "),
                       "ok" => checks.all? { |c| c["ok"] } }
        }
      end

      def ratio_at(results, conns, other)
        a = results.dig("serval", "levels", conns.to_s, "rps")
        b = results.dig(other, "levels", conns.to_s, "rps")
        a && b&.positive? ? (a / b).round(3) : nil
      end

      # The issue's "done means", each with its figure from this run.
      def targets(results)
        out = levels.map do |c|
          r = ratio_at(results, c, "iodine")
          { "target" => "c=#{c} serval/iodine >= 1.0", "value" => r, "ok" => !r.nil? && r >= 1.0 }
        end
        r = ratio_at(results, levels.first, "nginx")
        out << { "target" => "c=#{levels.first} serval/nginx >= 0.8", "value" => r, "ok" => !r.nil? && r >= 0.8 }
        if results.key?("serval-notiming")
          levels.each do |c|
            r = paired_cpu_ratio(results, c, "serval-notiming")
            out << { "target" => "c=#{c} timing on costs <= 2 % (CPU per request off / on >= 0.98, median of the rounds' pairs)",
                     "value" => r, "ok" => !r.nil? && r >= 0.98 }
          end
        end
        kb = results.dig("serval", "idle_kb_per_connection")
        out << { "target" => "serval idle <= 4 KB/connection", "value" => kb, "ok" => !kb.nil? && kb <= 4.0 }
        out
      end

      # other's server CPU per request / serval's, round by round (the two ran
      # minutes apart at most, in the same rotation), then the median of those
      # ratios: steadier than a ratio of two medians of rounds, which may come
      # from different rounds on a machine whose load moves.
      def paired_cpu_ratio(results, conns, other)
        mine = results.dig("serval", "rounds") || []
        theirs = results.dig(other, "rounds") || []
        ratios = mine.zip(theirs).filter_map do |a, b|
          x = a&.dig("levels", conns.to_s, "cpu_us_per_request")
          y = b&.dig("levels", conns.to_s, "cpu_us_per_request")
          y / x if x&.positive? && y
        end
        (r = median(ratios)) && r.round(3)
      end

      # other's server CPU per request / serval's (> 1: serval needs less).
      def cpu_ratio(results, conns, other)
        a = results.dig("serval", "levels", conns.to_s, "cpu_us_per_request")
        b = results.dig(other, "levels", conns.to_s, "cpu_us_per_request")
        a && b && a.positive? ? (b / a).round(3) : nil
      end

      def median(values)
        v = values.compact.sort
        return nil if v.empty?

        v.size.odd? ? v[v.size / 2] : (v[(v.size / 2) - 1] + v[v.size / 2]) / 2.0
      end

      def table(result)
        head = ["server", "version", "layout"]
        levels_in(result).each { |c| head.push("c=#{c} req/s", "p99", "us/req") }
        head.push("errors", "idle KB/conn", "idle open", "vs serval (c=#{levels_in(result).first})")
        rows = [head]
        first = levels_in(result).first
        result["servers"].each do |sname, s|
          row = [sname, s["version"].to_s, s["layout"].to_s]
          levels_in(result).each do |c|
            l = s.dig("levels", c) || {}
            row.push(fmt_rps(l["rps"]), fmt_ms(l["p99_ms"]), l["cpu_us_per_request"] ? format("%.1f", l["cpu_us_per_request"]) : "-")
          end
          errors = levels_in(result).map { |c| s.dig("levels", c, "errors") || "-" }.join("/")
          kb = s["idle_kb_per_connection"]
          row.push(errors, kb ? format("%.1f", kb) : "-", "#{s['idle_still_open']}/#{s['idle_opened']}",
                   rel(s.dig("levels", first, "rps"), result.dig("servers", "serval", "levels", first, "rps")))
          rows << row
        end
        notes = ["figures: #{result['pick']}; us/req: server CPU (process tree) per request; idle KB/conn: " \
                 "(RSS with the idle connections - RSS before) / connections opened; idle open: still open " \
                 "when measured / opened"]
        cpu = levels_in(result).filter_map do |c|
          a = result.dig("servers", "serval", "levels", c, "cpu_us_per_request")
          b = result.dig("servers", "iodine", "levels", c, "cpu_us_per_request")
          "c=#{c} #{format('%.2f', b / a)}" if a && b
        end
        notes << "serval/iodine by server CPU per request (iodine us / serval us; steadier than req/s on a busy machine): #{cpu.join(', ')}" unless cpu.empty?
        %w[serval-notiming serval-base].each do |other|
          next unless result["servers"].key?(other)

          by = levels_in(result).map do |c|
            rps = ratio_at(result["servers"], c, other)
            "c=#{c} req/s #{rps || 'n/a'}, CPU #{cpu_ratio(result['servers'], c, other) || 'n/a'} " \
              "(by the rounds' pairs #{paired_cpu_ratio(result['servers'], c, other) || 'n/a'})"
          end
          notes << "serval / #{other} (req/s: serval / #{other}; CPU: #{other} us / serval us): #{by.join('; ')}"
        end
        (result["targets"] || []).each do |t|
          notes << "#{t['ok'] ? 'meets' : 'MISSES'}: #{t['target']} (#{t['value'] || 'n/a'})"
        end
        [rows, notes]
      end

      def levels_in(result)
        result["servers"].values.first&.fetch("levels", {})&.keys || []
      end
    end
  end
end
