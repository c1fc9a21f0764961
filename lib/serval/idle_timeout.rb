# frozen_string_literal: true

module Serval
  # Puma's idle_timeout: a graceful stop once the server has gone `seconds`
  # without a new request and with none in flight. A thread of the
  # supervising process reads the request count from Launcher#stats (single
  # mode: the server's; cluster: the sum of the workers' last check-ins, so
  # there it is as fresh as worker_check_interval).
  class IdleTimeout
    def initialize(launcher, seconds)
      @launcher = launcher
      @seconds = seconds
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @stopped = false
    end

    def start
      @thread = Thread.new do
        Thread.current.name = "serval-idle-timeout"
        run
      rescue StandardError => e
        @launcher.log_writer.exception(e, "serval: idle_timeout")
      end
      self
    end

    def stop
      @mutex.synchronize do
        @stopped = true
        @cond.signal
      end
      @thread&.join(1)
    end

    # [requests so far, requests in flight] from a Launcher#stats Hash.
    def self.activity(stats)
      workers = stats[:worker_status]
      return [stats[:requests_count].to_i, stats[:busy_threads].to_i] unless workers

      statuses = workers.map { |w| w[:last_status] || {} }
      [statuses.sum { |s| s[:requests_count].to_i }, statuses.sum { |s| s[:busy_threads].to_i }]
    end

    private

    def run
      last = nil
      since = now
      interval = (@seconds / 4.0).clamp(0.01, 1.0)
      until wait(interval)
        next since = now unless @launcher.booted?

        count, busy = self.class.activity(@launcher.stats)
        if count != last || busy.positive?
          last = count
          since = now
        elsif now - since >= @seconds
          @launcher.log_writer.info("- No request for #{@seconds}s (idle_timeout): stopping")
          @launcher.stop
          return
        end
      end
    end

    # true once stopped
    def wait(seconds)
      @mutex.synchronize do
        @cond.wait(@mutex, seconds) unless @stopped
        @stopped
      end
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
