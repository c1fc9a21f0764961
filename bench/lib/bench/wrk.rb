# frozen_string_literal: true

module Bench
  # Runs wrk pinned to the client CPU and parses its --latency output.
  module Wrk
    UNITS_MS = { "us" => 0.001, "ms" => 1.0, "s" => 1000.0, "m" => 60_000.0, "h" => 3_600_000.0 }.freeze

    module_function

    def version
      _status, out, = Util.capture(%w[wrk --version], timeout: 10)
      out.lines.first.to_s[/wrk\s+(\S+)/, 1] || "unknown"
    end

    def command(ctx, url, duration:, connections:, threads: 1)
      ctx.pin_client(["wrk", "-t#{threads}", "-c#{connections}", "-d#{duration}s", "--latency", url])
    end

    # Returns a Hash of figures (plus the raw output), raising if wrk failed.
    def run(ctx, url, duration:, connections:, threads: 1)
      argv = command(ctx, url, duration: duration, connections: connections, threads: threads)
      status, out, timed_out = Util.capture(argv, timeout: duration + 30)
      raise Error, "wrk timed out: #{argv.join(' ')}" if timed_out
      raise Error, "wrk failed (#{status&.exitstatus}): #{out}" unless status&.success?

      parse(out).merge("command" => argv.join(" "))
    end

    def parse(out)
      latency = {}
      out.scan(/^\s+(\d+(?:\.\d+)?)%\s+(\d+(?:\.\d+)?)(us|ms|s|m|h)\s*$/) do |pct, value, unit|
        latency[pct.to_f] = (Float(value) * UNITS_MS.fetch(unit)).round(4)
      end
      rps = out[%r{^Requests/sec:\s+([\d.]+)}, 1]
      raise Error, "cannot parse wrk output:\n#{out}" unless rps && latency[50.0] && latency[99.0]

      errors = out[/Socket errors: (.*)$/, 1].to_s.scan(/(\w+) (\d+)/).to_h { |k, v| [k, Integer(v)] }
      {
        "rps" => Float(rps),
        "p50_ms" => latency[50.0],
        "p75_ms" => latency[75.0],
        "p90_ms" => latency[90.0],
        "p99_ms" => latency[99.0],
        "requests" => Integer(out[/(\d+) requests in/, 1] || 0),
        "non_2xx" => Integer(out[/Non-2xx or 3xx responses: (\d+)/, 1] || 0),
        "socket_errors" => errors,
        "raw" => out
      }
    end
  end
end
