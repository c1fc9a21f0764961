# frozen_string_literal: true

require "json"
require "securerandom"
$LOAD_PATH.unshift(File.expand_path("../../../lib", __dir__)) unless $LOAD_PATH.include?(File.expand_path("../../../lib", __dir__))
require "serval/advice"

module Bench
  # Where bench/run advice gets Serval's advice from a running server:
  #
  # 1. the control app's GET /advice (JSON, as `servalctl advise --json`),
  #    when the server has that endpoint;
  # 2. otherwise a window built from the server's `--log-requests` lines
  #    (run / idle / stall per request, Ruby 3.2+) given to
  #    Serval::Advice.recommend - what the server would compute itself.
  #
  # Either way the result is the recommender's Hash with String keys, plus
  # "source" saying which one answered.
  module AdviceSource
    module_function

    # Flags to start Serval with. The access log (the second source) only
    # with log: true (BENCH_ADVICE_FROM_LOG=1): writing a line per request
    # holds the GVL outside requests, which the window measures
    # (gvl_between) and the sweep's servers, which do not log, would not pay.
    def server_flags(control_port, token, log: false)
      (log ? ["--log-requests"] : []) + ["--control-url", "tcp://127.0.0.1:#{control_port}", "--control-token", token]
    end

    def log? = ENV["BENCH_ADVICE_FROM_LOG"] == "1"

    # Requests in the server's window (control app GET /window); nil when
    # it cannot be read.
    def window_requests(port, token)
      w = window(port, token)
      w && Integer(w["requests"] || 0)
    end

    def token = SecureRandom.hex(16)

    def fetch(control_port:, token:, log_path:, threads:, seconds:, path_prefix: "GET /work")
      return from_log(log_path, threads: threads, seconds: seconds, path_prefix: path_prefix) if log?

      from_control(control_port, token) or raise Error, "the server has no control app GET /advice " \
                                                        "(BENCH_ADVICE_FROM_LOG=1 builds the window from its access log)"
    end

    # GET /advice on the control app: nil when the endpoint does not exist
    # (or answers without a thread count).
    # A busy answer (503, "busy": the model still computing) is asked again
    # after its Retry-After, for up to BUSY_WAIT seconds.
    BUSY_WAIT = 180

    def from_control(port, token)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + BUSY_WAIT
      res = HTTP.get("127.0.0.1", port, "/advice?token=#{token}", timeout: 30)
      while res.status == 503 && (JSON.parse(res.body)["busy"] rescue false) &&
            Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        sleep 1
        res = HTTP.get("127.0.0.1", port, "/advice?token=#{token}", timeout: 30)
      end
      return nil unless res.status == 200

      body = JSON.parse(res.body)
      body = body["advice"] if body.is_a?(Hash) && body["advice"].is_a?(Hash)
      body.is_a?(Hash) && body.key?("threads") ? body.merge("source" => "control app GET /advice") : nil
    rescue SystemCallError, IOError, JSON::ParserError, HTTP::Timeout
      nil
    end

    # The server's measurement window (control app GET /window), for the
    # model to be asked again at other rates; nil when it cannot be read.
    def window(port, token)
      res = HTTP.get("127.0.0.1", port, "/window?token=#{token}", timeout: 30)
      res.status == 200 ? JSON.parse(res.body) : nil
    rescue SystemCallError, IOError, JSON::ParserError, HTTP::Timeout
      nil
    end

    # A window from the access log, as bench/advice_validate builds it. The
    # first `threads` requests (the process warming up) are left out.
    def from_log(log_path, threads:, seconds:, path_prefix:)
      samples = File.readlines(log_path).grep(/#{Regexp.escape(path_prefix)}/).filter_map { |l| sample(l) }
      samples.shift(threads)
      window = { requests: samples.size, seconds: seconds, max_threads: threads,
                 gvl_split: samples.first&.key?(:run) || false, samples: samples }
      advice = Serval::Advice.recommend(window, machine: { cpus: 1.0, cpu_source: "taskset -c 0" })
      JSON.parse(JSON.generate(advice)).merge("source" => "Serval::Advice.recommend on --log-requests lines")
    end

    def sample(line)
      f = ->(name) { line[/ #{name}=([\d.]+)/, 1]&.to_f&./(1000) }
      wall = line[/" \d{3} ([\d.]+)ms/, 1]&.to_f&./(1000)
      if line.include?(" run=")
        { run: f.call("run"), idle: f.call("idle"), stall: f.call("stall"), wall: wall }.compact
      elsif line.include?(" cpu=")
        { cpu: f.call("cpu"), wall: f.call("cpu") + f.call("wait") }
      end
    end
  end
end
