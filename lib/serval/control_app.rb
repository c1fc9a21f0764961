# frozen_string_literal: true

require "json"
require "rack/utils"
require "serval/commands"
require "serval/json_safe"

module Serval
  # The control app: a Rack app answering GET /<command>?token=TOKEN with
  # JSON. Served by a one-thread Server in the master (or single) process;
  # see Serval::Control and docs/control.md.
  #
  #   app = Serval::ControlApp.new(launcher, token: "s3cret")
  #   app.call(env) # => [200, {...}, ['{"backlog":0,...}']]
  class ControlApp
    COMMANDS = Commands::PATHS # path => launcher command
    QUERIES = Commands::QUERIES

    # /advice query parameters => [recommender option, parser]
    ADVICE_PARAMS = {
      "machines" => [:machines, ->(v) { Integer(v, 10) }],
      "extra_connections" => [:extra_connections, ->(v) { Integer(v, 10) }],
      "db_max_connections" => [:db_max_connections, ->(v) { Integer(v, 10) }],
      "target_rps" => [:target_rps, ->(v) { Float(v) }]
    }.freeze

    MAX_TRACE_SECONDS = 60

    # launcher: answers stats, enqueue(command), thread_backtraces and
    # gvl_trace(seconds) (Serval::Launcher; the endpoint answers 501 without it).
    def initialize(launcher, token:)
      raise ArgumentError, "a control token is required" if token.nil? || token.empty?

      @launcher = launcher
      @token = token
    end

    def call(env)
      return answer(405, error: "only GET is supported") unless %w[GET HEAD].include?(env["REQUEST_METHOD"])

      params = Rack::Utils.parse_query(env["QUERY_STRING"].to_s)
      return answer(403, error: "invalid or missing token") unless token_ok?(params["token"])

      path = env["PATH_INFO"].to_s
      if (command = COMMANDS[path])
        run_command(command)
      elsif (query = QUERIES[path])
        send(query, params)
      else
        answer(404, error: "unknown command #{path}")
      end
    rescue StandardError => e
      answer(500, error: "#{e.class}: #{e.message}")
    end

    private

    def token_ok?(given)
      given.is_a?(String) && given.bytesize == @token.bytesize && Rack::Utils.secure_compare(given, @token)
    end

    def run_command(command)
      if @launcher.enqueue(command) == false
        answer(501, error: "#{command} is not supported in this mode")
      else
        answer(200, status: "ok", command: command)
      end
    end

    def stats(_params)
      answer(200, @launcher.stats)
    end

    def thread_backtraces(_params)
      answer(200, @launcher.thread_backtraces)
    end

    def gc_stats(_params)
      answer(200, GC.stat)
    end

    # The last minute of requests, per figure (Launcher#window): what
    # /advice decides from. 501 without timing (timing false) or a launcher.
    def window(_params)
      w = @launcher.respond_to?(:window) ? @launcher.window : nil
      return answer(501, error: "no request window here (timing is off)") unless w

      answer(200, w)
    end

    # The launcher hands over the trace as JSON text (it can be tens of MB,
    # spliced from the workers' parts): sent as it is, never encoded again.
    def gvl_trace(params)
      return answer(501, error: "GVL tracing is not available here") unless @launcher.respond_to?(:gvl_trace)

      seconds = Float(params.fetch("seconds", "1"), exception: false)
      unless seconds&.positive? && seconds <= MAX_TRACE_SECONDS
        return answer(400, error: "seconds must be a number in (0, #{MAX_TRACE_SECONDS}]")
      end

      respond(200, @launcher.gvl_trace(seconds))
    rescue NotImplementedError => e
      answer(501, error: e.message)
    end

    # The recommendation (Serval::Advice) from the launcher's measurement
    # window and this machine's CPUs and memory. Its simulation costs 2-3 s
    # of CPU, spent in a child process (#model_process), on demand.
    def advice(params)
      return answer(501, error: "no measurement window in this build") unless @launcher.respond_to?(:window)

      options = advice_options(params) or
        return answer(400, error: "machines, extra_connections, db_max_connections: integers >= 0 " \
                                  "(machines >= 1); target_rps: a number > 0")
      window = @launcher.window
      return answer(503, error: "no measurement window yet (timing off, or not booted)") unless window

      require "serval/advice/local"
      answer(200, Advice::Local.recommend(window, stats: @launcher.stats, runner: model_process, **options))
    end

    # The advice's 2-3 s of model run in a child process at nice 19, not
    # in the serving process's GVL (Auto::ModelProcess); one per control
    # app, started on the first /advice, ended with this process.
    def model_process
      require "serval/auto/model_process"
      @model_process ||= Auto::ModelProcess.new
    end

    def advice_options(params)
      ADVICE_PARAMS.each_with_object({}) do |(name, (key, parse)), out|
        next unless params.key?(name)

        value = parse.call(params[name].to_s)
        return nil unless key == :target_rps ? value.finite? && value.positive? : value >= (key == :machines ? 1 : 0)

        out[key] = value
      end
    rescue ArgumentError, TypeError
      nil
    end

    # Infinity and NaN travel as strings ("+Inf", "-Inf", "NaN").
    def answer(status, body)
      json = JSONSafe.convert(body) { |f| f.to_s.sub("Infinity", "Inf").sub(/\AInf/, "+Inf") }
      respond(status, JSON.generate(json))
    end

    def respond(status, json)
      [status, { "content-type" => "application/json", "cache-control" => "no-store",
                 "content-length" => json.bytesize.to_s }, [json]]
    end
  end
end
