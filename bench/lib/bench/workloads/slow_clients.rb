# frozen_string_literal: true

module Bench
  module Workloads
    # slowhttptest against the server (slowloris: request heads that never
    # end; slow read: responses read through a tiny window) while wrk measures
    # a healthy client's req/s and p99 on GET /hello; compared with no attack.
    # A fresh server for each phase, so that one attack does not leave
    # stuck workers behind for the next.
    class SlowClients < Workload
      register "slow_clients"

      PHASES = %w[none slowloris slow_read].freeze

      def name = "slow_clients"
      def duration = Integer(ENV.fetch("BENCH_ATTACK_DURATION", ctx.duration.to_s))
      def attack_connections = Integer(ENV.fetch("BENCH_ATTACK_CONNECTIONS", "500"))
      def ramp = Float(ENV.fetch("BENCH_ATTACK_RAMP", "4"))
      def healthy_connections = 4

      def description
        "slowhttptest (#{attack_connections} connections: slowloris -H, slow read -X on /1mb) against one process " \
          "with #{ctx.threads} threads on CPU #{ctx.server_cpu}; a healthy wrk -c#{healthy_connections} -d#{duration}s " \
          "GET /hello (2 s timeout) after a #{ramp} s ramp"
      end

      def attack_argv(kind, port)
        base = "http://127.0.0.1:#{port}"
        len = (ramp + duration + 15).ceil.to_s
        case kind
        when "slowloris"
          ["slowhttptest", "-H", "-c", attack_connections.to_s, "-r", "250", "-i", "10", "-x", "24", "-p", "3",
           "-l", len, "-u", "#{base}/hello"]
        when "slow_read"
          ["slowhttptest", "-X", "-c", attack_connections.to_s, "-r", "250", "-w", "512", "-y", "1024",
           "-n", "5", "-z", "32", "-k", "1", "-p", "3", "-l", len, "-u", "#{base}/1mb"]
        end
      end

      def run(servers)
        raise Error, "slowhttptest not found (apt-get install -y slowhttptest)" unless Util.which("slowhttptest")

        results = {}
        servers.each do |server|
          phases = PHASES.to_h do |kind|
            [kind, with_server(server, "payload.ru", path: "/hello") { |process| measure(process, kind) }]
          end
          results[server.name] = { "version" => server.version, "layout" => server.layout(threads: ctx.threads),
                                   "phases" => phases }
          ctx.log "#{name}: #{server.name} " + phases.map { |k, f| format("#{k} %.0f req/s", f["rps"]) }.join(", ")
        end
        { "name" => name, "description" => description, "servers" => results,
          "ratio" => nil, "pick" => "one run per phase", "check" => { "target" => nil, "ok" => nil } }
      end

      def measure(process, kind)
        attacker = nil
        argv = attack_argv(kind, process.port)
        if argv
          log = File.join(ctx.scratch, "slowhttptest-#{process.server.name}-#{kind}.log")
          attacker = Util.spawn(ctx.pin_client(argv), out: log, err: log)
          sleep ramp
        end
        url = "http://127.0.0.1:#{process.port}/hello"
        f = Wrk.run(ctx, url, duration: duration, connections: healthy_connections, timeout: 2, lenient: true)
        { "rps" => f["rps"], "p50_ms" => f["p50_ms"], "p99_ms" => f["p99_ms"], "requests" => f["requests"],
          "errors" => f["non_2xx"] + f["socket_errors"].values.sum, "wrk_command" => f["command"],
          "attack_command" => argv&.join(" ") }
      ensure
        Util.stop(attacker, grace: 2) if attacker
      end

      def table(result)
        s = result["servers"]
        rows = [["server", "layout"] + PHASES.flat_map { |p| ["#{p} req/s", "p99"] } + ["slowloris vs serval", "slow read vs serval"]]
        s.each do |sname, r|
          ph = r["phases"]
          rows << [sname, r["layout"]] + PHASES.flat_map { |p| [fmt_rps(ph.dig(p, "rps")), fmt_p99(ph[p])] } +
                  [rel(ph.dig("slowloris", "rps"), s.dig("serval", "phases", "slowloris", "rps")),
                   rel(ph.dig("slow_read", "rps"), s.dig("serval", "phases", "slow_read", "rps"))]
        end
        notes = ["p99 'none served': the healthy client completed no request (timeouts) during the attack"]
        notes << "attacks: #{s.values.first&.dig('phases', 'slowloris', 'attack_command')&.sub(/\d+\/hello/, 'PORT/hello')}; " \
                 "#{s.values.first&.dig('phases', 'slow_read', 'attack_command')&.sub(%r{\d+/1mb}, 'PORT/1mb')}"
        [rows, notes]
      end

      def fmt_p99(phase)
        return "-" unless phase

        phase["p99_ms"] ? fmt_ms(phase["p99_ms"]) : "none served"
      end
    end
  end
end
