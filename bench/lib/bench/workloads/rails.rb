# frozen_string_literal: true

require "securerandom"

module Bench
  module Workloads
    # examples/rails (Rails 8.1, PostgreSQL, RAILS_ENV=production) under Serval
    # and Puma, each started the way the app's users would start it
    # (`serval -C config/puma.rb`, `puma -C config/puma.rb`) with 1 process x 3
    # threads (Rails' default), measured on a plain action and a 10-row DB read.
    # Needs Ruby >= 3.2 and the app's bundle and database: `bash .ci/rails.sh setup`.
    class RailsApp < Workload
      register "rails"

      THREADS = 3
      PATHS = { "plain" => "/plain", "db" => "/db" }.freeze

      # How each server starts the app (same config file, flags for the budget).
      class AppServer < Server
        attr_reader :base

        def initialize(base)
          super(base.ctx)
          @base = base
        end

        def name = base.name
        def app_dir = File.join(ctx.root, "examples", "rails")
        def chdir = app_dir
        def version = base.name == "serval" ? base.version : (Server.bundle_versions(ctx)["puma"] || "unknown")
        def layout(threads:, workers: 1) = "#{workers} x #{threads} threads"

        def env
          ctx.bundle_env.merge("BUNDLE_GEMFILE" => File.join(app_dir, "Gemfile"), "RAILS_ENV" => "production",
                               "SECRET_KEY_BASE" => RailsApp.secret, "RAILS_MAX_THREADS" => THREADS.to_s,
                               "METRICS_BIND" => nil, "WEB_CONCURRENCY" => nil)
        end

        def argv(app:, port:, threads:, workers: 1)
          flags = ["-C", "config/puma.rb", "-e", "production", "-b", "tcp://127.0.0.1:#{port}", "-t", "#{threads}:#{threads}"]
          case name
          when "serval" then ["bundle", "exec", "serval", *flags]
          when "puma" then ["bundle", "exec", "puma", *flags, "-w", "0"]
          else raise Error, "rails: no way to start #{name}"
          end
        end
      end

      def self.secret
        @secret ||= ENV.fetch("SECRET_KEY_BASE") { SecureRandom.hex(64) }
      end

      def name = "rails"
      def server_names = %w[serval puma]

      def description
        "examples/rails (Rails 8.1, PostgreSQL, production) with `-C config/puma.rb`, 1 process x #{THREADS} threads " \
          "on CPU #{ctx.server_cpu}: GET /plain and GET /db (10 rows), wrk -t1 -c#{connections}"
      end

      # As many connections as threads: every request finds a free thread.
      def connections = THREADS

      def unavailable_reason
        return "Rails 8.1 needs Ruby >= 3.2 (this is #{RUBY_VERSION})" if Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.2")

        app = File.join(ctx.root, "examples", "rails")
        status, out, = Util.capture(%w[bundle check], env: { "BUNDLE_GEMFILE" => File.join(app, "Gemfile"), "RUBYOPT" => nil },
                                                      chdir: app, timeout: 60)
        status&.success? ? nil : "examples/rails is not bundled (bash .ci/rails.sh setup): #{out.lines.last}"
      end

      def run(servers)
        servers = select(servers).map { |s| AppServer.new(s) }
        reason = unavailable_reason
        return skipped(reason) if reason

        figures = Hash.new { |h, k| h[k] = Hash.new { |hh, kk| hh[kk] = [] } }
        meta = {}
        ctx.rounds.times do |round|
          order(servers, round).each do |server|
            ctx.log "#{name}: round #{round + 1}/#{ctx.rounds} #{server.name}"
            process = server.start(app: "config.ru", port: Util.free_port, threads: THREADS)
            begin
              process.wait_ready(path: "/up", timeout: [ctx.boot_timeout, 60].max)
              sanity_check(process)
              PATHS.each { |key, path| figures[server.name][key] << measure(process, key, path) }
              meta[server.name] ||= { "version" => server.version, "server_command" => process.command.join(" "),
                                      "layout" => server.layout(threads: THREADS) }
            ensure
              process.stop
            end
          end
        end
        summarize(figures, meta)
      end

      def measure(process, key, path)
        url = "http://127.0.0.1:#{process.port}#{path}"
        Wrk.run(ctx, url, duration: ctx.warmup, connections: connections) if ctx.warmup.positive?
        cpu0 = Util.cpu_seconds(process.pid)
        f = Wrk.run(ctx, url, duration: ctx.duration, connections: connections)
        cpu1 = Util.cpu_seconds(process.pid)
        f["cpu_us_per_request"] = (cpu1 - cpu0) * 1e6 / f["requests"] if cpu0 && cpu1 && f["requests"].to_i.positive?
        ctx.log format("  %<k>-5s %<rps>.1f req/s  p50 %<p50>s  p99 %<p99>s", k: key, rps: f["rps"],
                                                                              p50: fmt_ms(f["p50_ms"]), p99: fmt_ms(f["p99_ms"]))
        f.reject { |k, _| k == "raw" }
      end

      def sanity_check(process)
        plain = HTTP.get("127.0.0.1", process.port, "/plain", timeout: 10)
        raise Error, "#{process.server.name}: GET /plain -> #{plain.status} #{plain.body[0, 200]}" unless plain.status == 200 && plain.body == "ok"

        db = HTTP.get("127.0.0.1", process.port, "/db", timeout: 10)
        rows = db.status == 200 ? JSON.parse(db.body) : []
        return if rows.size == 10

        raise Error, "#{process.server.name}: GET /db -> #{db.status}, #{rows.size} rows (bash .ci/rails.sh setup seeds 10)"
      end

      def summarize(figures, meta)
        results = figures.to_h do |sname, by_path|
          best = by_path.transform_values { |list| list.max_by { |r| r["rps"] } }
          [sname, meta[sname].merge("paths" => best, "rounds" => by_path,
                                    "wrk_command" => best.values.first&.fetch("command"))]
        end
        ratios = PATHS.keys.to_h do |key|
          s = results.dig("serval", "paths", key, "rps")
          p = results.dig("puma", "paths", key, "rps")
          [key, s && p && p.positive? ? (s / p).round(3) : nil]
        end
        { "name" => name, "description" => description, "servers" => results, "ratios" => ratios,
          "ratio" => ratios["plain"], "ratio_text" => ratios.map { |k, v| "#{k} #{v || 'n/a'}" }.join(", "),
          "pick" => "best of #{ctx.rounds} round(s) by req/s, per path", "check" => { "target" => nil, "ok" => nil } }
      end

      def skipped(reason)
        ctx.log "#{name}: not run: #{reason}"
        { "name" => name, "description" => description, "servers" => {}, "skipped" => reason, "ratio" => nil,
          "check" => { "target" => nil, "ok" => nil } }
      end

      def table(result)
        return [[["not run"], [result["skipped"]]], []] if result["skipped"]

        rows = [["server", "version", "processes x threads", "path", "req/s", "vs serval", "p50", "p99",
                 "server CPU/request", "errors", "rounds(req/s)"]]
        result["servers"].each do |sname, s|
          s["paths"].each do |key, f|
            base = result.dig("servers", "serval", "paths", key, "rps")
            rows << [sname, s["version"], s["layout"], PATHS[key], format("%.1f", f["rps"]), rel(f["rps"], base),
                     fmt_ms(f["p50_ms"]), fmt_ms(f["p99_ms"]),
                     f["cpu_us_per_request"] ? format("%.0f us", f["cpu_us_per_request"]) : "-",
                     (f["non_2xx"] + f["socket_errors"].values.sum).to_s,
                     s["rounds"][key].map { |r| format("%.0f", r["rps"]) }.join(", ")]
          end
        end
        notes = ["figures: #{result['pick']}",
                 "serval/puma req/s: #{result['ratio_text']}"]
        [rows, notes]
      end
    end
  end
end
