# frozen_string_literal: true

require "json"
require "fileutils"
require "time"

module Bench
  # bench/run: parse the command line, prepare the bundle, run the workloads,
  # print one table per workload and write bench/results/latest.json.
  class Runner
    USAGE = <<~TEXT
      usage: bench/run [--servers=serval,puma,...] [--check] [--quick] [--out=FILE] [--docs|--no-docs] [WORKLOAD...|all]
      workloads: %<workloads>s (default: all)
      servers:   %<servers>s (default: all; one whose gem is missing is skipped and named;
                 iodine and nginx run only where a workload names them (connections) unless --servers does)
      --docs: write the tables into docs/benchmarks/latest.md (between markers) and charts into
              docs/benchmarks/*.png (gnuplot); the default for `all`
      --quick: shorter runs where a workload has a quick mode (BENCH_QUICK=1; advice)
      environment: BENCH_DURATION (5 s) BENCH_WARMUP (2 s) BENCH_ROUNDS (1) BENCH_THREADS (4)
                   BENCH_CONNECTIONS (16) BENCH_SERVER_CPU (0) BENCH_CLIENT_CPU (1) BENCH_PIN (1)
                   BENCH_SLOW_CONNECTIONS (200) BENCH_SLOW_PROBES (50) SERVAL_EXE (exe/serval)
    TEXT

    # iodine and nginx are opt-in (Server#opt_in?): by default they run only in
    # the workloads that name them (connections).
    DEFAULT_SERVERS = %w[serval puma unicorn pitchfork falcon iodine nginx].freeze

    def initialize(argv, bench_dir:, out: $stdout)
      @argv = argv.dup
      @bench_dir = bench_dir
      @out = out
      @check = false
      @server_names = DEFAULT_SERVERS
      @docs = nil
      @explicit_servers = false
      @json_path = File.join(bench_dir, "results", "latest.json")
    end

    def usage
      format(USAGE, workloads: Workload.registry.keys.join(", "), servers: Server.registry.keys.join(", "))
    end

    def parse_args
      names = []
      @argv.each do |arg|
        case arg
        when "-h", "--help" then @out.puts(usage)
                                 return nil
        when "--check" then @check = true
        when "--quick" then ENV["BENCH_QUICK"] = "1"
        when "--docs" then @docs = true
        when "--no-docs" then @docs = false
        when /\A--servers=(.+)\z/ then @server_names = Regexp.last_match(1).split(",")
                                         @explicit_servers = true
        when /\A--out=(.+)\z/ then @json_path = File.expand_path(Regexp.last_match(1))
        when "all" then names.concat(Workload.registry.keys)
                        @docs = true if @docs.nil?
        when /\A-/ then raise ArgumentError, "unknown option #{arg}\n#{usage}"
        else
          raise ArgumentError, "unknown workload #{arg}\n#{usage}" unless Workload.registry.key?(arg)

          names << arg
        end
      end
      (@server_names - Server.registry.keys).each { |s| raise ArgumentError, "unknown server #{s}\n#{usage}" }
      names.empty? ? Workload.registry.keys : names.uniq
    end

    def run
      names = parse_args or return 0
      @ctx = Context.new(@bench_dir)
      preflight
      started = Util.now
      servers, unavailable = available_servers
      @server_names = servers.map(&:name)
      report = header(servers)
      report["unavailable"] = unavailable
      @out.puts(banner(report))
      unavailable.each { |n, why| @out.puts "# not run: #{n}: #{why}" }
      names.each do |wname|
        t0 = Util.now
        workload = Workload.registry.fetch(wname).new(@ctx)
        result = workload.run(workload.eligible(servers, explicit: @explicit_servers))
        result["seconds"] = (Util.now - t0).round(1)
        report["workloads"] << result
        print_table(result)
      end
      report["seconds"] = (Util.now - started).round(1)
      print_summary(report)
      write_json(report)
      write_docs(report) if @docs
      exit_code(report)
    ensure
      Util.stop_all
      @ctx&.cleanup
    end

    def available_servers
      unavailable = {}
      servers = @server_names.filter_map do |sname|
        server = Server.registry.fetch(sname).new(@ctx)
        why = server.unavailable_reason
        unavailable[sname] = why if why
        why ? nil : server
      end
      [servers, unavailable]
    end

    def write_docs(report)
      docs = Report.new(@ctx, report, json_path: @json_path)
      written = docs.write
      written.each { |path| @out.puts "wrote #{path}" }
    rescue Error => e
      @out.puts "docs not written: #{e.message}"
    end

    def preflight
      raise Error, "wrk not found (apt-get install -y wrk)" unless Util.which("wrk")

      # Keep the harness itself (the slow readers and probes) off the server's CPU.
      Util.capture(["taskset", "-p", "-c", @ctx.client_cpu, Process.pid.to_s], timeout: 10) if @ctx.pin?
      status, = Util.capture(%w[bundle check], env: @ctx.bundle_env, chdir: @bench_dir, timeout: 120)
      return if status&.success?

      @ctx.log "installing bench/Gemfile (bundle install)"
      status, out, = Util.capture(%w[bundle install], env: @ctx.bundle_env, chdir: @bench_dir, timeout: 900)
      raise Error, "bundle install failed:\n#{out}" unless status&.success?
    end

    def header(servers)
      {
        "timestamp" => Time.now.utc.iso8601,
        "command" => (["bench/run"] + @argv).join(" "),
        "settings" => {
          "duration_s" => @ctx.duration, "warmup_s" => @ctx.warmup, "rounds" => @ctx.rounds,
          "threads" => @ctx.threads, "connections" => @ctx.connections,
          "server_cpu" => @ctx.pin? ? @ctx.server_cpu : nil, "client_cpu" => @ctx.pin? ? @ctx.client_cpu : nil
        },
        "machine" => { "nproc" => Util.nproc, "cpu" => Util.cpu_model, "kernel" => kernel, "loadavg" => loadavg,
                       "autogroup" => autogroup }.compact,
        "versions" => { "ruby" => RUBY_DESCRIPTION, "wrk" => Wrk.version, "slowhttptest" => slowhttptest_version }.compact.merge(servers.to_h { |s| [s.name, s.version] }),
        "workloads" => []
      }
    end

    def slowhttptest_version
      return nil unless Util.which("slowhttptest")

      _status, out, = Util.capture(%w[slowhttptest -h], timeout: 10)
      out[/version (\S+)/, 1]
    end

    def loadavg
      File.read("/proc/loadavg").split.first(3).join(" ")
    rescue SystemCallError
      "unknown"
    end

    # true when the scheduler groups processes by session: then `nice` ranks
    # only within a session, and niced work started from another shell still
    # takes its share of the benchmark's CPUs (bench/NOTES.md, "Machine").
    def autogroup
      File.read("/proc/sys/kernel/sched_autogroup_enabled").strip == "1"
    rescue SystemCallError
      nil
    end

    def kernel
      File.read("/proc/sys/kernel/osrelease").strip
    rescue SystemCallError
      "unknown"
    end

    def banner(report)
      v = report["versions"]
      m = report["machine"]
      s = report["settings"]
      pin = s["server_cpu"] ? "server on CPU #{s['server_cpu']}, client on CPU #{s['client_cpu']}" : "not pinned"
      ["# #{report['command']}  (#{report['timestamp']})",
       "# #{m['nproc']} x #{m['cpu']}, linux #{m['kernel']}, load #{m['loadavg']}; #{pin}" +
         (m["autogroup"] ? " (autogroup on: `nice` does not keep other sessions' work off these CPUs)" : ""),
       "# #{v['ruby']}; wrk #{v['wrk']}; " + @server_names.map { |n| "#{n} #{v[n]}" }.join("; "),
       "# threads #{s['threads']}:#{s['threads']}, wrk -t1 -c#{s['connections']} -d#{s['duration_s']}s " \
       "after #{s['warmup_s']}s warm-up, #{s['rounds']} round(s) alternating server order"].join("\n")
    end

    def print_table(result)
      @out.puts
      @out.puts Report.table_text(@ctx, result)
      @out.flush
    end

    def print_summary(report)
      @out.puts
      @out.puts "## summary (serval/puma from this run)"
      report["workloads"].each do |w|
        check = w["check"] || {}
        verdict = if check["target"].nil? then ""
                  elsif check["ok"] then "  meets: #{check['target']}"
                  else "  MISSES: #{check['target']}"
                  end
        @out.puts format("%-18<name>s ratio %<ratio>s%<verdict>s  (%<sec>ss)", name: w["name"], ratio: w["ratio_text"] || w["ratio"] || "n/a",
                                                                                 verdict: verdict, sec: w["seconds"])
      end
      @out.puts "total: #{report['seconds']} s"
    end

    def write_json(report)
      FileUtils.mkdir_p(File.dirname(@json_path))
      tmp = "#{@json_path}.tmp"
      File.write(tmp, JSON.pretty_generate(report) + "\n")
      File.rename(tmp, @json_path)
      @out.puts
      @out.puts "raw results: #{@json_path}"
    end

    def exit_code(report)
      return 0 unless @check

      failed = report["workloads"].reject { |w| w.dig("check", "target").nil? || w.dig("check", "ok") }
      failed.each { |w| @out.puts "CHECK FAILED #{w['name']}: #{w.dig('check', 'target')}" }
      failed.empty? ? 0 : 1
    end
  end
end
