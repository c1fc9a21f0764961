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

      def summarize(servers, rounds, meta)
        result = super
        r = ratio(result["servers"], "rps", num: "serval-timing-on", den: "serval-timing-off")
        result.merge("ratio" => r,
                     "check" => { "target" => "timing on / off req/s >= #{target}", "ok" => r && r >= target })
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
