# frozen_string_literal: true

require "serval/advice/threads_text"
require "serval/keys"

module Serval
  module Advice
    # The text `servalctl advise` prints: the sweep as a table (threads,
    # predicted req/s, gain over one fewer thread, predicted stall and
    # latency at saturation), then the recommendation, its reasons and
    # warnings. Reads the Hash Recommender#call returns, with Symbol or
    # String keys (a saved --json answer works too).
    module Table
      module_function

      def render(advice)
        a = symbolize(advice)
        lines = []
        lines.concat(sweep_lines(a)) if a[:enough_data] && a[:sweep]
        lines << "" unless lines.empty?
        lines.concat(recommendation(a))
        lines.concat(section("Why", a[:reasons]))
        lines.concat(section("Warnings", a[:warnings]))
        "#{lines.join("\n")}\n"
      end

      HEAD = ["threads", "req/s", "gain", "stall mean", "p50", "p99", ""].freeze
      LOCK_HEAD = ["threads", "req/s", "gain", "stall mean", "lock mean", "p50", "p99", ""].freeze

      # A "lock mean" column when the advice modelled a lock (Advice::Lock).
      def sweep_lines(a)
        locked = a[:sweep].any? { |r| r[:lock_mean] }
        head = locked ? LOCK_HEAD : HEAD
        rows = a[:sweep].map do |r|
          mark = [("advised" if r[:threads] == a[:threads]), ("knee" if r[:threads] == a[:knee] && a[:knee] != a[:threads]),
                  ("running" if r[:threads] == a[:running_threads])].compact.join(", ")
          [r[:threads].to_s, format("%.1f", r[:rps]), gain(r[:gain]), ms(r[:stall_mean]),
           *(locked ? [ms(r[:lock_mean])] : []), ms(r[:wall_p50]), ms(r[:wall_p99]), mark.empty? ? "" : "<- #{mark}"]
        end
        widths = head.each_index.map { |i| ([head[i]] + rows.map { |r| r[i] }).map(&:size).max }
        last = head.size - 1
        fmt = ->(cells) { cells.each_with_index.map { |c, i| i.zero? || i == last ? c.ljust(widths[i]) : c.rjust(widths[i]) }.join("  ").rstrip }
        ["Predicted for one process, saturated (as many clients as threads):", fmt.call(head),
         *rows.map { |r| fmt.call(r) }]
      end

      def recommendation(a)
        return ["No advice yet: #{Array(a[:warnings]).first}"] unless a[:enough_data]

        out = [format("Advice: %s x %d processes per machine", Advice.threads_text(a), a[:processes]),
               format("  predicted max %.1f req/s per process, %.1f per machine", a[:max_rps_per_process],
                      a[:max_rps_per_machine] || a[:max_rps_per_process] * a[:processes]),
               format("  cpu share %.2f from %s requests%s", a[:cpu_share], grouped(a[:requests]),
                      a[:running_threads] ? " (running #{a[:running_threads]} threads)" : "")]
        if (st = a[:stall])
          out << format("  predicted GVL stall at %d threads, saturated: mean %s, p95 %s", a[:threads], ms(st[:mean]),
                        ms(st[:p95]))
        end
        out.concat(lock(a[:lock], a[:threads])) if a[:lock]
        top = a.dig(:precision, :load)
        Array(a[:load]).each do |l|
          range = top && top[:load] == l[:load] ? top[:latency_p99_range] : nil
          out << format("  at %d %% of max (%.1f req/s): p50 %s, p99 %s%s", (100 * l[:load]).round, l[:rate],
                        ms(l[:latency_p50]), ms(l[:latency_p99]),
                        range ? " (#{ms(range[0])} - #{ms(range[1])} within the window's precision)" : "")
        end
        out.concat(database(a[:database])) if a[:database]
        out.concat(capacity(a[:capacity])) if a[:capacity]
        out
      end

      # Waits for Ruby locks: measured, and what the model made of them.
      def lock(l, threads)
        out = [format("  lock waits (Ruby locks, not I/O): %s per request measured%s%s%s", ms(l[:measured_mean]),
                      l[:threads] ? " at #{l[:threads]} threads" : "",
                      l[:share_of_wall] ? format(" (%.1f %% of wall)", l[:share_of_wall] * 100) : "",
                      l[:measured_waited] ? format(", %d %% of requests waited", (l[:measured_waited] * 100).round) : "")]
        if l[:share]
          what = l[:held].to_s == "sends" ? "sends (a logger's writes)" : "waits"
          out << format("  modelled as one lock held through %d %% of the %s: predicted %s at %d threads, saturated",
                        (l[:share] * 100).round, what, ms(l[:predicted_mean]), threads)
        end
        out
      end

      def database(d)
        line = format("  database: %d connections per process, %d per machine", d[:per_process], d[:per_machine])
        line += format(", %d for %d machines + %d other", d[:fleet], d[:machines], d[:extra]) if d[:machines] > 1 || d[:extra].positive?
        line += format(" (limit %d: %s)", d[:max_connections], d[:fits] ? "fits" : "does not fit") if d[:max_connections]
        [line]
      end

      def capacity(c)
        [format("  for %.0f req/s: %d machines x %d processes x %d threads (each process at %d %% of its max), " \
                "p50 %s, p99 %s", c[:target_rps], c[:machines], c[:processes], c[:threads],
                (100 * c[:utilization]).round, ms(c[:latency_p50]), ms(c[:latency_p99]))]
      end

      def section(title, items)
        items = Array(items)
        return [] if items.empty?

        ["", "#{title}:", *items.map { |s| "  - #{s}" }]
      end

      def gain(g)
        return "-" unless g

        pct = (100 * g).round(1)
        format("%+.1f %%", pct.zero? ? 0.0 : pct)
      end

      def ms(seconds)
        return "-" unless seconds

        v = seconds * 1e3
        v >= 100 ? format("%.0f ms", v) : format("%.1f ms", v)
      end

      def grouped(n)
        n.to_i.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
      end

      def symbolize(obj) = Keys.symbolize(obj)
    end
  end
end
