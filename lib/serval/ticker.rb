# frozen_string_literal: true

require "serval/threads"

module Serval
  # A named background thread that runs a block every `interval` seconds
  # until #stop: the one start / sleep / stop pattern of the periodic jobs
  # that features start (the auto tuner, the I/O lane, the tmp_restart
  # plugin; the advice log line when no supervising loop runs it). What a
  # default process does periodically runs on its loop instead
  # (Supervisor#every, a cluster worker's loop). It sleeps on a condition
  # variable to a deadline, so #stop wakes it at once and a spurious wake-up
  # does not shorten an interval.
  #
  #   first:    :wait (sleep one interval before the first run) or :tick
  #   ready:    called first in the thread; a false answer ends the thread
  #             (e.g. "wait until the app has booted")
  #   setup:    called first in the thread (thread-local settings)
  #   priority: Thread#priority of the thread
  #   on_error: called with a StandardError the block raised; the thread
  #             goes on. Without it the error ends the thread, logged by
  #             Threads.spawn.
  class Ticker
    FIRST = %i[wait tick].freeze

    attr_reader :interval

    def initialize(name, interval, log_writer, first: :wait, ready: nil, setup: nil, priority: nil, on_error: nil)
      raise ArgumentError, "interval must be > 0" unless interval.to_f.positive?
      raise ArgumentError, "first is one of #{FIRST.join(', ')}" unless FIRST.include?(first)

      @name = name
      @interval = Float(interval)
      @log_writer = log_writer
      @first = first
      @ready = ready
      @setup = setup
      @priority = priority
      @on_error = on_error
      @mutex = Mutex.new
      @wake = ConditionVariable.new
      @stopped = false
    end

    def start(&block)
      raise ArgumentError, "a block to run" unless block

      @thread = Threads.spawn(@name, @log_writer) do
        Thread.current.priority = @priority if @priority
        @setup&.call
        run(block) if @ready.nil? || @ready.call
      end
      self
    end

    # Stops the thread and waits for it (at most `timeout` seconds; nil:
    # until it ends), unless called from the thread itself. A thread that
    # died of an error was logged when it died; stopping it does not raise.
    def stop(timeout = nil)
      @mutex.synchronize do
        @stopped = true
        @wake.broadcast
      end
      begin
        @thread&.join(timeout) unless @thread == Thread.current
      rescue StandardError
        nil
      end
      self
    end

    def stopped? = @mutex.synchronize { @stopped }

    def alive? = @thread&.alive? || false

    private

    def run(block)
      return if @first == :wait && pause

      loop do
        begin
          block.call
        rescue StandardError => e
          raise unless @on_error

          @on_error.call(e)
        end
        break if pause
      end
    end

    # Sleeps one interval; true once stopped.
    def pause
      @mutex.synchronize do
        deadline = now + @interval
        until @stopped
          left = deadline - now
          break if left <= 0

          @wake.wait(@mutex, left)
        end
        @stopped
      end
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
