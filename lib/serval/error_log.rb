# frozen_string_literal: true

require "serval/threads"
require "serval/configuration"

module Serval
  # One log line for every error response the native core answers itself
  # (400, 408, 413, 414, 417, 431, 501, 505; 500 when a body cannot be
  # buffered), which the application never sees:
  #
  #   serval: error response 413 Content Too Large peer=10.0.0.7 reason="request body too large"
  #
  # At most `limit` lines per second (option error_log_limit); the others are
  # counted and reported in one line once that second is over:
  #
  #   serval: 250 more error responses not logged in the last 1.0s (error_log_limit 10/s)
  #
  # The event loop records each answer in a bounded ring (ext/serval/errlog.c)
  # and never waits for this reader; records that do not fit are counted and
  # reported in the same line. Who drains the ring:
  #
  # - polled (#start(poll: true)): the process's own loop, on its main
  #   thread (Single#supervise, a cluster worker's loop), waits on #io
  #   beside its other descriptors and calls #drain when it is readable or
  #   #due seconds have passed. No thread.
  # - otherwise a thread of its own ("serval-errlog"), waiting without the
  #   GVL: for a Server that no loop watches (the control app's, a Server
  #   used on its own).
  #
  #   log = Serval::ErrorLog.new(core, log_writer, limit: 10).start(poll: true)
  #   IO.select([log.io], nil, nil, log.due)
  #   log.drain
  class ErrorLog
    WINDOW = 1.0 # seconds
    BATCH = 64 # ext/serval/core.c SV_ERRLOG_BATCH: a full batch may leave more

    # limit: lines per second; nil takes the default (Configuration::DEFAULTS)
    def initialize(core, log_writer, limit:)
      @core = core
      @log_writer = log_writer
      @limit = limit || Configuration::DEFAULTS[:error_log_limit]
      @window_at = nil
      @written = 0
      @suppressed = 0
      @lost = 0
      @stopping = false
      @thread = nil
      @io = nil
      @due_at = nil
      @mutex = Mutex.new # polled: #drain on the loop, #stop on the thread that stops the server
    end

    def start(poll: false)
      return self if @limit.zero? || @thread || @io

      if poll && (fd = @core.error_fd)
        @io = IO.for_fd(fd, autoclose: false) # the core owns the descriptor
      else
        @thread = Threads.spawn("serval-errlog", @log_writer) { run }
      end
      self
    end

    # Polled: readable while records wait (nil when not polled, or stopped).
    attr_reader :io

    # Polled: seconds until a suppressed count is due (then #drain), or nil.
    def due(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      at = @due_at
      at && [at - now, 0].max
    end

    # Polled: takes what the ring holds, without waiting, and logs it.
    def drain(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      @mutex.synchronize do
        return unless @io

        take(now)
      end
    rescue StandardError => e
      @log_writer.exception(e, "serval: error log")
    end

    # After the core has stopped: writes what is left, then returns.
    def stop(timeout = 2.0)
      return stop_polled if @io

      thread = @thread
      return unless thread

      @stopping = true
      @core.wake_error_events
      thread.kill unless thread.join(timeout)
      @thread = nil
    end

    # The rate limit, apart from the thread: events as Core#error_events
    # gives them, dropped records, the monotonic time now. Returns the
    # seconds until a suppressed count is due, or nil.
    def handle(events, dropped, now)
      roll(now)
      @lost += dropped
      events.each do |status, reason, detail, peer|
        if @written < @limit
          @written += 1
          @log_writer.error(%(serval: error response #{status} #{reason} peer=#{peer} reason="#{detail}"))
        else
          @suppressed += 1
        end
      end
      pending? ? [@window_at + WINDOW - now, 0].max : nil
    end

    # Writes the suppressed count of the current window now (at stop).
    def flush(now)
      report(now) if pending?
    end

    private

    def take(now)
      loop do
        events, dropped = @core.error_events(0)
        wait = handle(events, dropped, now)
        @due_at = wait && now + wait
        break if events.size < BATCH
      end
    end

    def stop_polled
      @mutex.synchronize do
        break unless @io

        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        take(now)
        flush(now)
        @io = nil
        @due_at = nil
      end
    end

    def run
      wait = nil
      loop do
        events, dropped = @core.error_events(wait || 3600.0)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        wait = handle(events, dropped, now)
        break if @stopping && events.empty? && dropped.zero?
      end
      flush(Process.clock_gettime(Process::CLOCK_MONOTONIC))
    rescue StandardError => e
      @log_writer.exception(e, "serval: error log stopped")
    end

    def pending?
      (@suppressed + @lost).positive?
    end

    # A new window starts at the first event after the previous one ended.
    def roll(now)
      return if @window_at && now < @window_at + WINDOW

      report(now) if pending?
      @window_at = now
      @written = 0
    end

    def report(now)
      span = @window_at ? now - @window_at : 0.0
      lost = @lost.positive? ? " (#{@lost} of them not recorded: the error ring was full)" : ""
      n = @suppressed + @lost
      @log_writer.error(format("serval: %d more error response%s not logged in the last %.1fs " \
                               "(error_log_limit %d/s)%s", n, n == 1 ? "" : "s", span, @limit, lost))
      @suppressed = 0
      @lost = 0
    end
  end
end
