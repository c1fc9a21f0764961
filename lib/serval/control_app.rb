# frozen_string_literal: true

require "json"
require "rack/utils"
require "serval/commands"
require "serval/json_safe"
require "serval/threads"

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

    # /advice: seconds one request waits for the model before it is answered
    # 503 busy (Retry-After: RETRY_AFTER); the model keeps computing and a
    # later request with the same options gets its result. At most one
    # request waits at a time, so the control server's other thread stays
    # free for status/stats.
    ADVICE_WAIT = 10.0
    RETRY_AFTER = 1
    ADVICE_KEEP = 60.0 # seconds an undelivered result waits for the request that asked for it

    # launcher: answers stats, enqueue(command), thread_backtraces and
    # gvl_trace(seconds) (Serval::Launcher; the endpoint answers 501 without it).
    # runner: computes advice (#advice(window, **options)); default the
    # model's child process (Auto::ModelProcess), started on the first /advice.
    def initialize(launcher, token:, runner: nil, advice_wait: ADVICE_WAIT)
      raise ArgumentError, "a control token is required" if token.nil? || token.empty?

      @launcher = launcher
      @token = token
      @runner = runner
      @advice_wait = advice_wait
      @advice_lock = Mutex.new
      @advice_job = nil    # {key:, options:, thread:, started:} while the model computes
      @advice_done = nil   # {key:, options:, body:, finished:, delivered:} the last result
      @advice_waiting = false
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

    # Readies /advice before anyone asks (Control starts it on a thread of
    # its own): the advice's code loaded here and the model's child started,
    # so that the first answer costs what later ones do - on examples/rails
    # at full load 1.8 s, where booting both on the first ask made it 3.1 s
    # (bench/NOTES.md "Session 30"). Nothing when timing is off (no window
    # to advise on) or a runner was given; a child that cannot start is
    # tried again by the first /advice.
    def prepare_advice
      return unless @launcher.respond_to?(:window) && @runner.nil?
      return if @launcher.respond_to?(:options) && @launcher.options.is_a?(Hash) && @launcher.options[:timing] == false

      require "serval/advice/local"
      model_process.prestart
    rescue ModelProcessError
      nil
    end

    # In a forked child: the model's child belongs to the parent.
    def forget_model = @model_process&.forget

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
    # window and this machine's CPUs and memory. Its model runs in a child
    # process (#model_process), on demand, on a thread of its own: this
    # request waits for it up to ADVICE_WAIT, then answers 503 busy with
    # Retry-After (the same request later gets the result; `wait=S` in the
    # query waits S seconds instead, 0..ADVICE_WAIT). A window and
    # options seen before (same digest) answer from the last result at once.
    def advice(params)
      return answer(501, error: "no measurement window in this build") unless @launcher.respond_to?(:window)

      options = advice_options(params)
      wait = params.key?("wait") ? Float(params["wait"].to_s, exception: false) : 0.0
      unless options && wait&.finite? && wait >= 0 && wait <= ADVICE_WAIT
        return answer(400, error: "machines, extra_connections, db_max_connections: integers >= 0 " \
                                  "(machines >= 1); target_rps: a number > 0; wait: seconds in [0, #{ADVICE_WAIT.to_i}]")
      end

      window = @launcher.window
      return answer(503, error: "no measurement window yet (timing off, or not booted)") unless window

      wait = @advice_wait unless params.key?("wait")
      key = advice_key(window, options)
      job = @advice_lock.synchronize do
        done = @advice_done
        if done && (done[:key] == key || (done[:options] == options && !done[:delivered] &&
                                          now - done[:finished] < ADVICE_KEEP))
          done[:delivered] = true
          return respond(200, done[:body])
        end
        return busy("another request is waiting for it") if @advice_waiting
        if @advice_job && @advice_job[:options] != options
          return busy("computing advice for other options")
        end

        @advice_job ||= start_advice(key, window, options)
        @advice_waiting = true
        @advice_job
      end
      finished = begin
        job[:thread].join(wait)
      ensure
        @advice_lock.synchronize { @advice_waiting = false }
      end
      return busy("the model is still computing") unless finished

      @advice_lock.synchronize do
        raise job[:error] if job[:error]

        @advice_done[:delivered] = true if @advice_done&.equal?(job[:done])
        respond(200, job[:done][:body])
      end
    end

    def start_advice(key, window, options)
      job = { key: key, options: options, started: now }
      stats = @launcher.stats
      require "serval/advice/local" # here, not on the thread: one require at a time
      job[:thread] = Threads.spawn("serval-advice", nil) do
        body = JSON.generate(json_safe(Advice::Local.recommend(window, stats: stats, runner: model_process, **options)))
        @advice_lock.synchronize do
          job[:done] = @advice_done = { key: key, options: options, body: body, finished: now, delivered: false }
          @advice_job = nil
        end
      rescue StandardError => e
        @advice_lock.synchronize do
          job[:error] = e
          @advice_job = nil
        end
      end
      job
    end

    def busy(why)
      job = @advice_job
      since = job ? format(", %.1f s so far", now - job[:started]) : ""
      status, headers, body = answer(503, error: "busy: advice is being computed (#{why}#{since}); retry", busy: true)
      [status, headers.merge("retry-after" => RETRY_AFTER.to_s), body]
    end

    # The same window and options: the same advice (the model is seeded).
    def advice_key(window, options)
      require "digest"
      Digest::SHA256.hexdigest(Marshal.dump([window, options.sort]))
    rescue TypeError # a window that cannot be dumped: never the same
      Object.new.object_id.to_s
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # The advice's model runs in a child process, not in the serving
    # process's GVL (Auto::ModelProcess); one per control app, started on
    # the first /advice, ended with this process. Someone waits for this
    # answer: the child takes a fair share of a busy CPU (priority :batch,
    # about a second of CPU per advice), where the advice log's idle one
    # would wait for the server to leave the CPU idle.
    def model_process
      return @runner if @runner

      require "serval/auto/model_process"
      @model_process ||= Auto::ModelProcess.new(priority: :batch)
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
      respond(status, JSON.generate(json_safe(body)))
    end

    def json_safe(body) = JSONSafe.convert(body) { |f| f.to_s.sub("Infinity", "Inf").sub(/\AInf/, "+Inf") }

    def respond(status, json)
      [status, { "content-type" => "application/json", "cache-control" => "no-store",
                 "content-length" => json.bytesize.to_s }, [json]]
    end
  end
end
