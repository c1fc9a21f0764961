# frozen_string_literal: true

module Bench
  module Servers
    # Serval from this checkout with per-request timing off
    # (bench/config/timing_off.rb): the same run measures what timing costs.
    # Opt-in: it runs in `connections` (which names it) or where --servers does.
    class ServalNoTiming < Serval
      register "serval-notiming"

      def name = "serval-notiming"
      def opt_in? = true

      def argv(**kw)
        args = super
        args.insert(args.index(exe) + 1, "-C", File.join(ctx.bench_dir, "config", "timing_off.rb"))
      end
    end

    # Serval from another checkout, BENCH_SERVAL_BASE (its extension built for
    # the same Ruby), run exactly as this one: a before/after comparison in one
    # rotation (git worktree add --detach /tmp/base main && cd /tmp/base &&
    # bundle exec rake compile). Opt-in, and unavailable without the variable.
    class ServalBase < Serval
      register "serval-base"

      def name = "serval-base"
      def opt_in? = true
      def root = ENV.fetch("BENCH_SERVAL_BASE", "")
      def exe = File.join(root, "exe", "serval")

      def unavailable_reason
        return "BENCH_SERVAL_BASE is not set (a Serval checkout with its extension built)" if root.empty?

        File.exist?(exe) ? nil : "no #{exe}"
      end

      def version
        @version ||= begin
          _status, out, = Util.capture(["git", "-C", root, "rev-parse", "--short", "HEAD"], timeout: 10)
          "base #{out.strip}"
        end
      end

      def argv(**kw)
        args = super
        args[args.index("-I") + 1] = File.join(root, "lib")
        args
      end
    end
  end
end
