# frozen_string_literal: true

require "serval/threads"

module Serval
  # Raised in a request's thread when it ran past request_timeout and
  # request_timeout_raise is on. An Exception, not a StandardError (as
  # rack-timeout's): a bare `rescue => e` in app code does not swallow it,
  # `ensure` blocks still run.
  class RequestTimeout < Exception # rubocop:disable Lint/InheritException
  end

  # request_timeout (docs/configuration.md "Request timeout"): one watchdog
  # thread (serval-timeout) per process, started only when the option is set.
  # Request threads register their request as they start it and leave as it
  # ends; the watchdog answers a request that runs past its limit at once
  # (Native::Request#expire: 503, or 504 when a proxy header says a proxy sent
  # it; connection: close), optionally raises RequestTimeout in its thread,
  # and a thread still not back after the grace period is reported stuck: in
  # a cluster worker, the worker asks to be replaced (Serval.replace_worker).
  class RequestTimeoutWatchdog
    ENV_KEY = "serval.request_timeout" # seconds for this request, set by the app (a middleware)
    PROXY_HEADERS = %w[HTTP_X_FORWARDED_FOR HTTP_FORWARDED HTTP_X_REQUEST_START].freeze
    TICK_MAX = 0.5
    TICK_MIN = 0.01

    Entry = Struct.new(:request, :env, :thread, :started, :expired, :stuck)

    attr_reader :timeouts

    # replace_me: a callable taking a reason (a cluster worker's), or nil.
    def initialize(timeout:, raise_in_thread:, grace:, log_writer:, replace_me: nil)
      @timeout = timeout
      @raise = raise_in_thread
      @grace = grace
      @log_writer = log_writer
      @replace_me = replace_me
      @tick = (timeout / 20.0).clamp(TICK_MIN, TICK_MAX)
      @entries = {} # thread => Entry
      @mutex = Mutex.new
      @timeouts = 0
      @stuck_total = 0
      @stopping = false
    end

    # A Server part (ServerParts): the handler reports each request to it.
    # A cluster worker's Server gets replace_me (Serval.replace_worker's).
    def self.attach(server, options, log_writer)
      watchdog = new(timeout: options[:request_timeout], raise_in_thread: options[:request_timeout_raise],
                     grace: options[:request_timeout_grace], log_writer: log_writer, replace_me: options[:replace_me])
      server.handler.watchdog = watchdog
      watchdog
    end

    def start
      @thread = Threads.spawn("serval-timeout", @log_writer) { run }
      self
    end

    def stop
      @mutex.synchronize { @stopping = true }
      @thread&.wakeup
      @thread&.join(1)
    rescue ThreadError
      nil
    end

    # The calling request thread starts serving request (its env built).
    # The clock starts when the request was queued (complete, waiting for a
    # thread), as its client's wait does.
    def watch(request, env)
      queued = request.respond_to?(:queued_at) ? request.queued_at : 0.0
      entry = Entry.new(request, env, Thread.current, queued.positive? ? queued : now, false, false)
      @mutex.synchronize { @entries[Thread.current] = entry }
      expire(entry, @timeout) if now - entry.started >= @timeout # it waited its whole limit for a thread
    end

    # Runs the block (the app's part of a request) with RequestTimeout let
    # in; RequestHandler#call defers it everywhere else.
    def interruptible(&block)
      Thread.handle_interrupt(RequestTimeout => :immediate, &block)
    end

    # The calling thread's request ended.
    def done
      @mutex.synchronize { @entries.delete(Thread.current) }
    end

    def stats
      @mutex.synchronize do
        { request_timeouts: @timeouts, stuck_threads: @entries.count { |_, e| e.stuck },
          stuck_threads_total: @stuck_total }
      end
    end

    # One pass over the requests in flight at time t (the watchdog's tick;
    # tests call it with their own clock).
    def check(t = now)
      entries = @mutex.synchronize { @entries.values }
      entries.each do |e|
        limit = limit_of(e.env)
        next if t - e.started < limit

        expire(e, limit) unless e.expired
        stuck(e, limit) if !e.stuck && t - e.started >= limit + @grace
      end
    end

    private

    def run
      until @mutex.synchronize { @stopping }
        sleep(@tick)
        check
      end
    end

    def limit_of(env)
      given = env[ENV_KEY]
      given.is_a?(Numeric) && given.positive? ? given.to_f : @timeout
    end

    def expire(entry, limit)
      entry.expired = true
      status = PROXY_HEADERS.any? { |h| entry.env.key?(h) } ? 504 : 503
      answered = entry.request.expire(status, "request ran past request_timeout (#{format('%g', limit)}s)")
      @mutex.synchronize { @timeouts += 1 }
      @log_writer.error("serval: #{describe(entry)} ran past request_timeout (#{format('%g', limit)}s); " +
                        (answered ? "answered #{status}" : "its response had begun, left to finish"))
      raise_in(entry, limit) if @raise
    rescue StandardError => e
      @log_writer.exception(e, "serval: request timeout")
    end

    # Only while the request is still the thread's own (under the mutex
    # #done takes): never into the thread's next request.
    def raise_in(entry, limit)
      @mutex.synchronize do
        next unless @entries[entry.thread].equal?(entry) && entry.thread.alive?

        entry.thread.raise(RequestTimeout, "request ran past request_timeout (#{format('%g', limit)}s)")
      end
    end

    def stuck(entry, limit)
      entry.stuck = true
      @mutex.synchronize { @stuck_total += 1 }
      frames = (entry.thread.backtrace || []).first(5).join("\n    ")
      reason = "#{describe(entry)} still running #{format('%g', limit + @grace)}s after it started"
      if @replace_me
        @log_writer.error("serval: #{reason}; this worker will be replaced\n    #{frames}")
        @replace_me.call("stuck request: #{describe(entry)}")
      else
        @log_writer.error("serval: STUCK REQUEST: #{reason}; its thread is lost until it returns " \
                          "(single mode cannot replace the process; restart it)\n    #{frames}")
      end
    end

    def describe(entry)
      "#{entry.env['REQUEST_METHOD']} #{entry.env['PATH_INFO']}"
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
