# frozen_string_literal: true

require "serval/native_ext"
require "serval/ticker"

module Serval
  module Auto
    # The I/O lane: while requests in flight sit idle (streaming to a slow
    # client, long polling, a slow external API), the pool may run as many
    # extra threads as there are such requests, up to max_io_threads, so they
    # do not hold the few threads GVL-bound requests need. Nothing is marked
    # by the app: a thread polls Native::GVL.idle_in_request(io_lane_idle)
    # (the GVL hook knows, for every request thread, how long its request has
    # been idle) every POLL seconds and sets ThreadPool#lane. When those
    # requests end, the count drops and the pool returns to max_threads
    # (ThreadPool: surplus threads leave). Needs the GVL hook (Ruby 3.2+) and
    # timing on; without them the lane stays closed and says so once.
    class IoLane
      POLL = 0.1 # seconds between polls: one scan of the GVL slot table, no request pays for it

      attr_reader :idle, :peak

      def initialize(pool, max_io_threads:, idle_after:, log_writer:, poll: POLL)
        @pool = pool
        @max = max_io_threads
        @idle_after = idle_after
        @log_writer = log_writer
        @poll = poll
        @idle = 0
        @peak = 0
      end

      # A Server part (ServerParts): max_io_threads.
      def self.attach(server, options, log_writer)
        new(server.thread_pool, max_io_threads: options[:max_io_threads], idle_after: options[:io_lane_idle],
                                log_writer: log_writer)
      end

      def start
        unless Native::GVL.enabled?
          @log_writer.warn("max_io_threads: the I/O lane needs the GVL hook (Ruby 3.2+ with timing on); it stays closed")
          return self
        end

        @ticker = Ticker.new("serval-io-lane", @poll, @log_writer).start { check }
        self
      end

      def stop
        @ticker&.stop(5)
        @pool.lane = 0
      end

      # One poll; public for tests.
      def check
        idle = Native::GVL.idle_in_request(@idle_after) || 0
        extra = [idle, @max].min
        @idle = idle
        @peak = extra if extra > @peak
        @pool.lane = extra if extra != @pool.lane
        extra
      end

      def stats
        { max_io_threads: @max, idle_requests: @idle, lane_threads: @pool.lane, peak_lane_threads: @peak,
          idle_after: @idle_after }
      end
    end
  end
end
