# frozen_string_literal: true

require "stringio"
require "serval/response_writer"
require "serval/hijack"
require "serval/empty_input"
require "serval/app_wrappers"
require "serval/request_timeout"

module Serval
  # Turns one native Request into a Rack call and its response.
  class RequestHandler
    RACK_INPUT = "rack.input"
    RACK_EARLY_HINTS = "rack.early_hints"
    # HTTP_HOST: every HTTP/1.1 request has a Host (C takes the key out of
    # an HTTP/1.0 request's env that has none)
    ALWAYS_SET = %w[REQUEST_METHOD PATH_INFO QUERY_STRING REQUEST_URI SERVER_PROTOCOL REMOTE_ADDR SERVER_NAME
                    SERVER_PORT HTTP_HOST rack.input rack.hijack rack.response_finished rack.after_reply].freeze

    attr_reader :timing # a Timing::Recorder (attached by Timing::Part), or nil
    attr_writer :watchdog # a RequestTimeoutWatchdog (request_timeout), or nil

    def initialize(app, options, log_writer)
      @app = AppWrappers.wrap(app, options) # supported_http_methods, fiber_per_request
      @log_writer = log_writer
      @template = env_template(options[:rack_url_scheme]).freeze
      @early_hints = options[:early_hints]
      @log_requests = options[:log_requests]
      @errors = ErrorResponder.new(options[:lowlevel_error_handler], log_writer)
      @writer = ResponseWriter.new
      @timing = nil # nil when off: one branch per request (see docs/observability.md)
      @timing_every = nil
    end

    # Per-request timing (Timing::Part): the recorder whose sampled
    # requests get a Serval::Timing. With --log-requests every line carries
    # the timing fields: every request is sampled.
    def timing=(recorder)
      @timing = recorder
      @timing_every = recorder && (@log_requests ? 1 : recorder.every)
    end

    # The env comes from C with every per-request key in place
    # (Native::Request#env): rack.hijack is the Request itself (its #call is
    # the full hijack), rack.input the template's EmptyInput unless the
    # request has a body. A plain Array body is written by one C call
    # (Request#respond); ResponseWriter takes every other body.
    def call(request)
      return serve(request) unless @watchdog

      # request_timeout_raise: RequestTimeout may reach this thread only
      # while the app runs (RequestTimeoutWatchdog#interruptible); one that
      # comes as the request ends waits here and is absorbed, never reaching
      # the thread's next request.
      Thread.handle_interrupt(RequestTimeout => :never) { serve(request) }
    rescue RequestTimeout
      nil
    end

    private

    def serve(request)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC) if @log_requests
      env = request.start(@template, @timing_every) # the env, and the timing begun (with timing on)
      @watchdog&.watch(request, env)
      if (body = request.body)
        env[RACK_INPUT] = input = make_input(body)
      end
      env[RACK_EARLY_HINTS] = EarlyHints.new(request) if @early_hints
      status = headers = error = nil
      begin
        if @watchdog
          status, headers = @watchdog.interruptible { respond(request, env) }
        else
          status, headers = respond(request, env)
        end
      rescue ConnectionError => e
        error = e
        request.abort
      rescue Exception => e
        error = e
        status, headers = @errors.respond(request, env, e)
      end
      # ends the timing first (stats never lag the client), then sends the rest; the Timing of a
      # sampled request, else nil
      timing = request.finish
      finished = true
      GVLTrace.note(timing, env) if timing && GVLTrace.recording
      Timing::Routes.note(env, timing) if timing # sampled requests only: the advice's per-route view
      log_access(env, status, started, timing) if @log_requests
      callbacks = request.callbacks
      run_callbacks(env, status, headers, error, *callbacks) if callbacks
    ensure
      # When the thread was killed (a stop timeout) or anything before
      # finish raised, the connection is closed instead of staying open with
      # no one left to answer it. (After finish it would be a no-op.)
      @watchdog&.done
      request.abort unless finished
      input.close if input && input.is_a?(File)
    end

    # The app's response itself is returned (serve takes its status and
    # headers): no Array of its own per request.
    def respond(request, env)
      response = @app.call(env)
      status, headers, body = response
      # respond: a plain Array body written in one call (:array), a full hijack (true: nothing to
      # write), else false: ResponseWriter takes the rest
      written = request.respond(status, headers, body)
      @writer.write(request, env, status, headers, body) unless written
      response
    ensure
      close_body(body) unless written == :array # a plain Array: nothing to close
    end

    def env_template(url_scheme = nil)
      # Every request sets these (Request#env in C, ext/serval/env.c): the
      # env puts the per-request ones first, then the request's fields, then
      # the template's entries; a frozen template lets C copy a base holding
      # a client's repeating values, so that only the per-request ones and
      # the fields are set on each copy.
      env = ALWAYS_SET.to_h { |key| [key, nil] }
      env.merge!(
        "SCRIPT_NAME" => "",
        "SERVER_SOFTWARE" => "Serval/#{VERSION}",
        "rack.errors" => $stderr,
        "rack.multithread" => true,
        "rack.multiprocess" => false,
        "rack.run_once" => false,
        "rack.url_scheme" => url_scheme || "http", # TLS connections set https
        "rack.hijack?" => true,
        "rack.input" => EmptyInput # a request with a body sets its own
      )
      env["rack.version"] = [1, 6] if rack2?
      env
    end

    def rack2?
      defined?(Rack::RELEASE) && Rack::RELEASE.start_with?("2.")
    end

    def make_input(body)
      body.is_a?(String) ? StringIO.new(body) : File.for_fd(body, "rb")
    end

    def close_body(body)
      body.close if body.respond_to?(:close)
    rescue StandardError => e
      @log_writer.exception(e, "body.close raised")
    end

    def run_callbacks(env, status, headers, error, finished, after)
      finished.reverse_each do |callback|
        callback.call(env, status, headers, error)
      rescue StandardError => e
        @log_writer.exception(e, "rack.response_finished callback raised")
      end
      after.each do |callback|
        callback.call
      rescue StandardError => e
        @log_writer.exception(e, "rack.after_reply callback raised")
      end
    ensure
      # Emptied once run. A stale copy of either Array on this thread's machine
      # stack (which the GC scans conservatively) outlives the request while
      # the thread waits for the next one; the closures in it hold the env
      # (Rails' executor: the controller, the page), which then ages into the
      # old generation and costs major GCs (bench/NOTES.md "Session 28").
      finished.clear unless finished.frozen?
      after.clear unless after.frozen?
    end

    def log_access(env, status, started, timing)
      ms = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000
      query = env["QUERY_STRING"]
      path = query.nil? || query.empty? ? env["PATH_INFO"] : "#{env['PATH_INFO']}?#{query}"
      @log_writer.access(format('%s - - [%s] "%s %s %s" %s %.2fms',
                                env["REMOTE_ADDR"], Time.now.strftime("%d/%b/%Y:%H:%M:%S %z"),
                                env["REQUEST_METHOD"], path, env["SERVER_PROTOCOL"], status || "-", ms) +
                        (timing ? " #{timing.log_fields}" : ""))
    end
  end
end
