# frozen_string_literal: true

require "delegate"

module Bench
  module Workloads
    # Issue 10 item 4, CPU/IO fairness, Serval only: the same server started
    # with each `--fair-timeslice` setting (off = `--no-fair-timeslice`, the
    # "before"), 4 threads, pinned to one CPU. Each round, for each setting:
    #
    #   alone   - wrk -c1 on the I/O-bound /io (6 x 10 ms sleeps)
    #   mixed   - the same, while a second wrk -c1 sends CPU-bound requests
    #             (/work?ms=50&cpu=1: 50 ms of computing each) back to back
    #   app     - wrk -c8 on /work?ms=20&cpu=0.5 (half computing, half
    #             waiting): an ordinary mixed app's throughput
    #
    # Figures are medians of rounds; ratios ("vs off") are taken within each
    # round and their median shown. Targets (issue 10): the I/O request keeps
    # >= 50 % of its alone rate in the mixed run, and the mixed run's
    # throughput (CPU-bound + I/O req/s) stays >= 0.97 of off.
    class Fairness < Workload
      register "fairness"

      IO_PATH = "/io?n=6&ms=10"
      CPU_PATH = "/work?ms=50&cpu=1"
      APP_PATH = "/work?ms=20&cpu=0.5"
      THREADS = 4

      def name = "fairness"
      def duration = Integer(ENV.fetch("BENCH_FAIR_DURATION", ctx.duration.to_s))
      def rounds = Integer(ENV.fetch("BENCH_FAIR_ROUNDS", "3"))
      def settings = ENV.fetch("BENCH_FAIR_SLICES", "off,2").split(",").map(&:strip)
      def server_names = ["serval"]

      def description
        "Serval 1 x #{THREADS} threads on CPU #{ctx.server_cpu}, per --fair-timeslice setting: GET #{IO_PATH} with " \
          "wrk -c1 alone, then beside wrk -c1 on GET #{CPU_PATH} (CPU-bound); then wrk -c8 on GET #{APP_PATH}; " \
          "#{duration}s each, median of #{rounds} rounds"
      end

      # The Serval adapter with extra flags before the rackup file.
      class Variant < SimpleDelegator
        attr_reader :label

        def initialize(server, label, flags)
          super(server)
          @label = label
          @flags = flags
        end

        def argv(**kw)
          argv = __getobj__.argv(**kw)
          argv[0...-1] + @flags + [argv.last]
        end

        def start(**kw)
          ServerProcess.new(self, **kw).start
        end
      end

      def flags(setting)
        setting == "off" ? ["--no-fair-timeslice"] : ["--fair-timeslice", setting]
      end

      def run(servers)
        serval = select(servers).first or raise Error, "fairness needs the serval server"
        per = Hash.new { |h, k| h[k] = [] }
        commands = {}
        rounds.times do |round|
          order(settings, round).each do |setting|
            ctx.log "#{name}: round #{round + 1}/#{rounds} --fair-timeslice #{setting}"
            variant = Variant.new(serval, "serval #{setting}", flags(setting))
            with_server(variant, "mixed.ru", threads: THREADS) do |process|
              figures, cmds = measure(process.port, process.pid)
              commands[setting] ||= cmds.merge("server" => process.command.join(" "))
              per[setting] << figures
              ctx.log format("  I/O alone %<a>.1f, mixed: I/O %<i>.1f + CPU %<c>.1f req/s (server CPU %<s>.0f %%); " \
                             "app %<p>.1f req/s", a: figures["io_alone"], i: figures["io_mixed"], c: figures["cpu_mixed"],
                                                  s: figures["server_cpu"].to_f * 100, p: figures["app"])
            end
          end
        end
        summarize(per, commands, serval)
      end

      # share: the CPU the server got during the mixed run (1.0 = all of its
      # pinned CPU; less means other processes took some of it).
      def measure(port, pid)
        base = "http://127.0.0.1:#{port}"
        opts = { duration: duration, connections: 1, timeout: duration + 5, lenient: true }
        alone = Wrk.run(ctx, base + IO_PATH, **opts)
        cpu0 = Util.cpu_seconds(pid)
        t0 = Util.now
        cpu = Thread.new { Wrk.run(ctx, base + CPU_PATH, **opts) }
        sleep 0.2 # the CPU-bound client is running before the I/O one starts
        io = Wrk.run(ctx, base + IO_PATH, **opts.merge(duration: duration > 2 ? duration - 1 : duration)) # inside the CPU run
        cpu = cpu.value
        cpu1 = Util.cpu_seconds(pid)
        share = cpu0 && cpu1 ? (cpu1 - cpu0) / (Util.now - t0) : nil
        app = Wrk.run(ctx, base + APP_PATH, duration: duration, connections: 8)
        [{ "io_alone" => alone["rps"], "io_mixed" => io["rps"], "io_mixed_p99_ms" => io["p99_ms"],
           "cpu_mixed" => cpu["rps"], "mixed_total" => io["rps"] + cpu["rps"], "app" => app["rps"],
           "server_cpu" => share, "io_keeps" => alone["rps"].positive? ? io["rps"] / alone["rps"] : nil },
         { "io" => alone["command"], "cpu" => cpu["command"], "app" => app["command"] }]
      end

      def median(list) = Util.median(list)

      # Per setting: median figures, and the median over rounds of each
      # round's ratio to off (same round).
      def summarize(per, commands, serval)
        base = per["off"]
        results = {}
        per.each do |setting, list|
          r = %w[io_alone io_mixed io_mixed_p99_ms cpu_mixed mixed_total app io_keeps server_cpu].to_h { |k| [k, median(list.map { |f| f[k] })] }
          if base
            %w[mixed_total cpu_mixed io_mixed app].each do |k|
              r["#{k}_vs_off"] = median(list.zip(base).map { |f, b| b[k].to_f.positive? ? f[k] / b[k] : nil })
            end
          end
          r["rounds"] = list
          r["commands"] = commands[setting]
          results[setting] = r
        end
        best = results.reject { |k, _| k == "off" }.values.first
        ok = best && best["io_keeps"] && best["io_keeps"] >= 0.5 && best["mixed_total_vs_off"].to_f >= 0.97
        {
          "name" => name, "description" => description, "version" => serval.version, "settings" => results,
          "servers" => { "serval" => { "version" => serval.version, "wrk_command" => commands.values.first&.fetch("io") } },
          "ratio" => nil,
          "pick" => "median of #{rounds} rounds",
          "check" => { "target" => "I/O keeps >= 50 % of alone; mixed throughput >= 0.97 x off", "ok" => ok }
        }
      end

      def table(result)
        rows = [["--fair-timeslice", "I/O alone req/s", "mixed: I/O req/s", "I/O keeps", "I/O p99", "mixed: CPU req/s",
                 "mixed total req/s", "total vs off", "CPU vs off", "server CPU (mixed)", "app req/s (-c8)", "app vs off"]]
        result["settings"].each do |setting, r|
          rows << [setting == "off" ? "off (before)" : "#{setting} ms", fmt_rps(r["io_alone"]), fmt_rps(r["io_mixed"]),
                   r["io_keeps"] ? format("%.0f %%", r["io_keeps"] * 100) : "-", fmt_ms(r["io_mixed_p99_ms"]),
                   fmt_rps(r["cpu_mixed"]), fmt_rps(r["mixed_total"]), ratio_s(r["mixed_total_vs_off"]),
                   ratio_s(r["cpu_mixed_vs_off"]), r["server_cpu"] ? format("%.0f %%", r["server_cpu"] * 100) : "-",
                   fmt_rps(r["app"]), ratio_s(r["app_vs_off"])]
        end
        [rows, ["figures: #{result['pick']}; ratios: median over rounds of each round's figure / off's",
                "target (issue 10): I/O keeps >= 50 % beside a CPU-bound request, total vs off >= 0.97"]]
      end

      def ratio_s(value)
        value ? format("%.3fx", value) : "-"
      end
    end
  end
end
