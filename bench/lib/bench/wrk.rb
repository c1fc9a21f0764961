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

    # headers: extra "Name: value" strings; script: a lua file (wrk -s) and
    # script_args its arguments (after wrk's `--`); timeout: wrk's per-request
    # timeout in seconds (its default is 2).
    def command(ctx, url, duration:, connections:, threads: 1, headers: [], script: nil, script_args: [], timeout: nil)
      argv = ["wrk", "-t#{threads}", "-c#{connections}", "-d#{duration}s", "--latency"]
      headers.each { |h| argv.push("-H", h) }
      argv.push("-s", script) if script
      argv.push("--timeout", "#{timeout.ceil}s") if timeout
      argv << url
      argv.push("--", *script_args.map(&:to_s)) if script && !script_args.empty?
      ctx.pin_client(argv)
    end

    # Returns a Hash of figures (plus the raw output), raising if wrk failed.
    # lenient: a run that completed no request gives rps 0 and nil
    # latencies instead of an error (a server under attack may serve none).
    def run(ctx, url, duration:, connections:, threads: 1, lenient: false, **opts)
      argv = command(ctx, url, duration: duration, connections: connections, threads: threads, **opts)
      status, out, timed_out = Util.capture(argv, timeout: duration + 30 + opts.fetch(:timeout, 2).to_i)
      raise Error, "wrk timed out: #{argv.join(' ')}" if timed_out
      raise Error, "wrk failed (#{status&.exitstatus}): #{out}" unless status&.success?

      parse(out, lenient: lenient).merge("command" => argv.join(" "))
    end

    # The lua script that tags every request with r=BASE+1, BASE+2, ... (its
    # comment says why): script: tagged_script, script_args: [BASE].
    def tagged_script
      File.join(__dir__, "tagged.lua")
    end

    # The lua script that prints wrk's latency histogram and more percentiles
    # (wrk only prints p50/75/90/99).
    def histogram_script
      File.join(__dir__, "histogram.lua")
    end

    def parse(out, lenient: false)
      latency = {}
      out.scan(/^\s+(\d+(?:\.\d+)?)%\s+(\d+(?:\.\d+)?)(us|ms|s|m|h)\s*$/) do |pct, value, unit|
        latency[pct.to_f] = (Float(value) * UNITS_MS.fetch(unit)).round(4)
      end
      rps = out[%r{^Requests/sec:\s+([\d.]+)}, 1]
      requests = Integer(out[/(\d+) requests in/, 1] || 0)
      unless rps && latency[50.0] && latency[99.0] && (requests.positive? || !lenient)
        raise Error, "cannot parse wrk output:\n#{out}" unless lenient && rps

        latency = {}
      end

      errors = out[/Socket errors: (.*)$/, 1].to_s.scan(/(\w+) (\d+)/).to_h { |k, v| [k, Integer(v)] }
      {
        "rps" => Float(rps),
        "p50_ms" => latency[50.0],
        "p75_ms" => latency[75.0],
        "p90_ms" => latency[90.0],
        "p99_ms" => latency[99.0],
        "requests" => requests,
        "non_2xx" => Integer(out[/Non-2xx or 3xx responses: (\d+)/, 1] || 0),
        "socket_errors" => errors,
        "raw" => out
      }.merge(parse_script(out))
    end

    # Lines printed by histogram.lua: "pct P MS" and "hist UPPER_MS COUNT".
    def parse_script(out)
      pcts = out.scan(/^pct ([\d.]+) ([\d.]+)$/).to_h { |p, v| [p, Float(v).round(3)] }
      hist = out.scan(/^hist ([\d.]+) (\d+)$/).map { |u, c| [Float(u).round(3), Integer(c)] }
      extra = {}
      extra["percentiles_ms"] = pcts unless pcts.empty?
      extra["histogram_ms"] = hist unless hist.empty?
      if (m = out.match(/^minmax ([\d.]+) ([\d.]+) ([\d.]+)$/))
        extra["min_ms"], extra["mean_ms"], extra["max_ms"] = m.captures.map { |x| Float(x).round(3) }
      end
      extra
    end
  end
end
