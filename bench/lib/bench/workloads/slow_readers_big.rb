# frozen_string_literal: true

require_relative "slow_readers"

module Bench
  module Workloads
    # Issue 11 items 2 and 3: N connections ask for a body the app generates
    # for each request (4 MiB by default, no to_path) and never read it, while
    # a fresh client probes as in slow_readers. Also records the server's
    # resident memory (process tree) before, at its peak (sampled every
    # 100 ms while the slow readers are connected) and some seconds after
    # they went away.
    class SlowReadersBig < SlowReaders
      register "slow_readers_big"

      def name = "slow_readers_big"
      def slow_count = Integer(ENV.fetch("BENCH_SLOW_BIG_CONNECTIONS", "1000"))
      def body_mb = Integer(ENV.fetch("BENCH_SLOW_BIG_MB", "4"))
      def settle = Float(ENV.fetch("BENCH_SLOW_SETTLE", "5"))
      def after_wait = Float(ENV.fetch("BENCH_SLOW_AFTER", "5"))
      def slow_path = "/gen?mb=#{body_mb}"
      def slow_bytes = body_mb << 20

      def description
        "#{slow_count} connections (MSS #{mss}) GET #{slow_path} (#{body_mb} MiB generated per request) and never " \
          "read; a fresh client sends #{probes} sequential GET / (new connection each, #{probe_timeout}s timeout); " \
          "RSS of the server's processes before, peak (100 ms samples) and #{after_wait}s after the readers closed"
      end

      def measure(process)
        before = process.rss_kb
        peak = before
        done = false
        sampler = Thread.new do
          until done
            kb = process.rss_kb
            peak = kb if kb > peak
            sleep 0.1
          end
        end
        figures = super # closes the slow connections before it returns
        sleep after_wait
        after = process.rss_kb
        done = true
        sampler.join
        figures.merge("rss_before_mb" => mb(before), "rss_peak_mb" => mb(peak), "rss_after_mb" => mb(after))
      end

      def mb(kb) = (kb / 1024.0).round(1)

      def summarize(results)
        out = super
        s = results["serval"]
        limit = 512
        out["check"] = {
          "target" => "serval: every probe gets 200 within #{prompt}s and peak RSS grows < #{limit} MB",
          "ok" => s && s["ok_prompt"] == s["probes"] && s["rss_peak_mb"] - s["rss_before_mb"] < limit
        }
        out
      end

      def table(result)
        rows = [["server", "version", "slow conns", "RSS before", "RSS peak", "RSS after", "200 within #{prompt}s",
                 "p50", "p99", "max"]]
        result["servers"].each do |sname, s|
          rows << [sname, s["version"], s["slow_connections"].to_s, "#{s['rss_before_mb']} MB", "#{s['rss_peak_mb']} MB",
                   "#{s['rss_after_mb']} MB", "#{s['ok_prompt']}/#{s['probes']}", fmt_ms(s["p50_ms"]),
                   fmt_ms(s["p99_ms"]), fmt_ms(s["max_ms"])]
        end
        _rows, notes = super
        [rows, notes]
      end
    end
  end
end
