# frozen_string_literal: true

module Bench
  # A workload measures every selected server and returns a JSON-able Hash:
  #   "name", "description", "servers" => { name => figures }, "summary" => text lines,
  #   "check" => { "target" => text, "ok" => true/false/nil }.
  # Workloads live in bench/lib/bench/workloads/, one file each, and register
  # themselves by name; the order of registration is the order of `all`.
  class Workload
    @registry = {}

    class << self
      attr_reader :registry

      def register(name)
        Workload.registry[name.to_s] = self
      end
    end

    attr_reader :ctx

    def initialize(ctx)
      @ctx = ctx
    end

    def name
      raise NotImplementedError
    end

    def description
      raise NotImplementedError
    end

    def run(_servers)
      raise NotImplementedError
    end

    # Servers in alternating order: round 0 as given, round 1 reversed, ...
    # so that no server always runs first (or last) on a warm machine.
    def order(servers, round)
      round.even? ? servers : servers.reverse
    end

    def app_path(file)
      File.join(ctx.bench_dir, "apps", file)
    end

    # Start server with app, wait until it answers path, yield, always stop it.
    def with_server(server, app, path: "/", threads: ctx.threads, workers: 1, cpus: nil, max_connections: nil)
      process = server.start(app: app_path(app), port: Util.free_port, threads: threads, workers: workers, cpus: cpus,
                             max_connections: max_connections)
      process.wait_ready(path: path)
      yield process
    ensure
      process&.stop
    end

    # Names of the servers this workload runs (nil: every selected one).
    def server_names
      nil
    end

    def select(servers)
      names = server_names
      names ? servers.select { |s| names.include?(s.name) } : servers
    end

    # Whether the workload also runs a server that runs no Rack app (nginx's
    # `return 200`, the limit line).
    def limit_line? = false

    # The selected servers this workload runs (bench/run passes these to run):
    # no limit line unless the workload takes one; an opt-in server (Server#opt_in?)
    # only when --servers named it (explicit) or server_names does.
    def eligible(servers, explicit: false)
      names = server_names
      servers.select do |s|
        next false if !s.rack? && !limit_line?
        next true unless s.opt_in?

        explicit || names&.include?(s.name)
      end
    end

    # "0.52x": value / serval's value of the same figure from the same run.
    def vs_serval(results, sname, key)
      a = results.dig(sname, key)
      b = results.dig("serval", key)
      return "-" unless a && b && b.to_f.positive?

      format("%.2fx", a.to_f / b)
    end

    # value / base as "0.52x" ("-" when either is missing).
    def rel(value, base)
      return "-" unless value && base && base.to_f.positive?

      format("%.2fx", value.to_f / base)
    end

    def fmt_rps(value)
      return "-" if value.nil?

      value >= 100 ? format("%.0f", value) : format("%.1f", value)
    end

    def ratio(results, key, num: "serval", den: "puma")
      a = results.dig(num, key)
      b = results.dig(den, key)
      return nil unless a && b && b.positive?

      (a.to_f / b).round(3)
    end

    def fmt_ms(value)
      return "-" if value.nil?

      value >= 100 ? format("%.0fms", value) : format("%.2fms", value)
    end
  end

  # Base for the closed-loop throughput workloads: wrk -t1 -cN against one URL.
  class WrkWorkload < Workload
    def app
      raise NotImplementedError
    end

    def path
      "/"
    end

    def expected_bytes
      nil
    end

    # Serval/Puma req/s target from the issue (nil: none).
    def target
      nil
    end

    def connections
      ctx.connections
    end

    # Processes per server (1: single mode) and the CPUs they are pinned to
    # (nil: BENCH_SERVER_CPU).
    def workers
      1
    end

    def cpus
      nil
    end

    def wrk_options
      {}
    end

    def run(servers)
      servers = select(servers)
      rounds = Hash.new { |h, k| h[k] = [] }
      meta = {}
      ctx.rounds.times do |round|
        order(servers, round).each do |server|
          ctx.log "#{name}: round #{round + 1}/#{ctx.rounds} #{server.name}"
          with_server(server, app, path: path, workers: workers, cpus: cpus) do |process|
            sanity_check(process)
            url = "http://127.0.0.1:#{process.port}#{path}"
            Wrk.run(ctx, url, duration: ctx.warmup, connections: connections, **wrk_options) if ctx.warmup.positive?
            cpu0 = Util.cpu_seconds(process.pid) if measure_cpu?
            figures = Wrk.run(ctx, url, duration: ctx.duration, connections: connections, **wrk_options)
            record_cpu(figures, cpu0, Util.cpu_seconds(process.pid)) if measure_cpu?
            ctx.log format("  %<rps>.1f req/s  p50 %<p50>s  p99 %<p99>s", rps: figures["rps"],
                                                                           p50: fmt_ms(figures["p50_ms"]), p99: fmt_ms(figures["p99_ms"]))
            rounds[server.name] << figures
            meta[server.name] ||= { "version" => server.version, "server_command" => process.command.join(" "),
                                    "wrk_command" => figures["command"],
                                    "layout" => server.layout(threads: ctx.threads, workers: workers) }
          end
        end
      end
      summarize(servers, rounds, meta)
    end

    # Workloads that also record the server's CPU seconds per request (one
    # process): on a pinned CPU, saturated throughput is 1 / that, and it is
    # far less disturbed by other tenants of a shared machine than req/s.
    def measure_cpu?
      false
    end

    def record_cpu(figures, before, after)
      return unless before && after && figures["requests"].to_i.positive?

      figures["cpu_us_per_request"] = (after - before) * 1e6 / figures["requests"]
    end

    def sanity_check(process)
      res = HTTP.get("127.0.0.1", process.port, path, timeout: 5)
      raise Error, "#{process.server.name}: GET #{path} -> #{res.status}" unless res.status == 200
      return unless expected_bytes && res.body.bytesize != expected_bytes

      raise Error, "#{process.server.name}: GET #{path} body #{res.body.bytesize} bytes, expected #{expected_bytes}"
    end

    def summarize(servers, rounds, meta)
      results = {}
      servers.each do |server|
        list = rounds[server.name]
        next if list.empty?

        best = list.max_by { |r| r["rps"] }
        results[server.name] = meta[server.name].merge(
          "rps" => best["rps"], "p50_ms" => best["p50_ms"], "p99_ms" => best["p99_ms"],
          "errors" => best["non_2xx"] + best["socket_errors"].values.sum,
          "rounds" => list.map { |r| r.reject { |k, _| k == "raw" } }
        )
      end
      r = ratio(results, "rps")
      {
        "name" => name, "description" => description, "servers" => results,
        "ratio" => r, "pick" => "best of #{ctx.rounds} rounds by req/s",
        "check" => { "target" => target && "serval/puma req/s >= #{target}", "ok" => target && r && r >= target }
      }
    end

    def table(result)
      rows = [["server", "version", "processes x threads", "req/s", "vs serval", "p50", "p99", "errors", "rounds(req/s)"]]
      result["servers"].each do |sname, s|
        rows << [sname, s["version"], s["layout"].to_s, format("%.1f", s["rps"]), vs_serval(result["servers"], sname, "rps"),
                 fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]),
                 s["errors"].to_s, s["rounds"].map { |r| format("%.0f", r["rps"]) }.join(", ")]
      end
      notes = ["figures: #{result['pick']}"]
      notes << "serval/puma req/s: #{result['ratio'] || 'n/a'}#{target ? " (issue target >= #{target})" : ''}"
      [rows, notes]
    end
  end
end
