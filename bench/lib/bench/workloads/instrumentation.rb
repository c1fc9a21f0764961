# frozen_string_literal: true

module Bench
  module Workloads
    # Serval with per-request timing on vs off, same run, at saturation
    # (docs/observability.md). Target: on >= 0.98 x off in req/s.
    class Instrumentation < WrkWorkload
      register "instrumentation"

      # Serval with a config file that switches timing on or off.
      class Variant < Servers::Serval
        def initialize(ctx, timing)
          super(ctx)
          @timing = timing
        end

        def name = "serval-timing-#{@timing ? 'on' : 'off'}"

        def argv(**kw)
          args = super
          config = File.join(ctx.bench_dir, "config", "timing_#{@timing ? 'on' : 'off'}.rb")
          args.insert(args.index(exe) + 1, "-C", config)
        end
      end

      def name = "instrumentation"
      def app = "hello.ru"
      def expected_bytes = 11
      def target = 0.98

      def description
        "hello world, Serval timing on vs off, wrk -t1 -c#{connections}, one process on CPU #{ctx.server_cpu}"
      end

      def run(_servers)
        super([Variant.new(ctx, false), Variant.new(ctx, true)])
      end

      def select(servers) = servers

      def measure_cpu? = true

      # Three figures, all from this run: best-of-rounds req/s on / off,
      # median req/s on / off, and the ratio of the medians of server CPU
      # seconds per request, off / on (the throughput ratio a dedicated CPU
      # would show). The check uses the CPU figure: on this shared 2-core VM
      # one configuration's rounds spread by tens of percent in req/s, far
      # more than the 2 % being measured.
      def summarize(servers, rounds, meta)
        result = super
        on = result["servers"]["serval-timing-on"]
        off = result["servers"]["serval-timing-off"]
        best = ratio(result["servers"], "rps", num: "serval-timing-on", den: "serval-timing-off")
        median_rps = on && off && (median(on["rounds"], "rps") / median(off["rounds"], "rps")).round(3)
        cpu_on = on && median(on["rounds"], "cpu_us_per_request")
        cpu_off = off && median(off["rounds"], "cpu_us_per_request")
        cpu = cpu_on && cpu_off && (cpu_off / cpu_on).round(3)
        result.merge("ratio" => cpu, "ratio_best_rps" => best, "ratio_median_rps" => median_rps,
                     "cpu_us_per_request" => { "on" => cpu_on&.round(2), "off" => cpu_off&.round(2) },
                     "check" => { "target" => "timing off / on server CPU per request >= #{target}",
                                  "ok" => cpu && cpu >= target })
      end

      def table(result)
        rows, notes = super
        cpu = result["cpu_us_per_request"] || {}
        notes = ["figures: #{result['pick']}",
                 "server CPU per request (median of rounds): timing off #{cpu['off']} us, on #{cpu['on']} us; " \
                 "off / on = #{result['ratio'] || 'n/a'} (issue target >= #{target})",
                 "req/s on / off: best rounds #{result['ratio_best_rps'] || 'n/a'}, " \
                 "medians #{result['ratio_median_rps'] || 'n/a'}"]
        [rows, notes]
      end

      private

      def median(rounds, key)
        values = rounds.map { |r| r[key] }.compact.sort
        return nil if values.empty?

        mid = values.size / 2
        values.size.odd? ? values[mid] : (values[mid - 1] + values[mid]) / 2.0
      end
    end

    # The same with a 5 ms CPU endpoint.
    class InstrumentationCPU < Instrumentation
      register "instrumentation_cpu"

      def name = "instrumentation_cpu"
      def app = "mixed.ru"
      def path = "/work?ms=5&cpu=1.0"
      def expected_bytes = nil

      def description
        "5 ms CPU per request, Serval timing on vs off, wrk -t1 -c#{connections}, one process on CPU #{ctx.server_cpu}"
      end
    end
  end
end
