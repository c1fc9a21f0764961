# frozen_string_literal: true

require "serval/serval_ext"

module Serval
  # Where one request's time went, in seconds. Put in env["serval.timing"]
  # when the request is measured; complete from rack.response_finished on.
  #
  #   queue           request complete in Serval's event loop -> app called
  #   upstream_queue  proxy's X-Request-Start / X-Queue-Start stamp -> app
  #                   called (includes queue); nil without the header
  #   wall            app called -> response handed to the loop
  #   cpu             CPU time of the worker thread over wall
  #   gc              GC time of the whole process over wall (GC.total_time)
  #   run             held the GVL (Ruby 3.2+; nil on 3.1)
  #   idle            without the GVL and not asking for it: I/O, sleep (3.2+)
  #   stall           waiting for the GVL (3.2+)
  #   wait            wall - run (3.2+: idle + stall); on 3.1 wall - cpu,
  #                   where I/O and stall cannot be told apart
  class Timing
    attr_reader :queue, :upstream_queue, :wall, :cpu, :gc, :run, :idle, :stall, :wait,
                :started_ns, :finished_ns # CLOCK_MONOTONIC nanoseconds

    def initialize(start, gc_start, queue, upstream_queue)
      @start = start
      @started_ns = start[0]
      @finished_ns = nil
      @gc_start = gc_start
      @queue = queue
      @upstream_queue = upstream_queue
      @wall = @cpu = @gc = @run = @idle = @stall = @wait = nil
    end

    # True when run/idle/stall come from the GVL hook.
    def gvl_split?
      !@run.nil?
    end

    # Called once, by the Recorder, when the response is done.
    def finish(stop, gc_stop)
      s = @start
      @finished_ns = stop[0]
      @wall = (stop[0] - s[0]) / 1e9
      @cpu = (stop[1] - s[1]) / 1e9
      @gc = (gc_stop - @gc_start) / 1e9
      if stop[2] && s[2]
        @run = (stop[2] - s[2]) / 1e9
        @idle = (stop[3] - s[3]) / 1e9
        @stall = (stop[4] - s[4]) / 1e9
        @wait = @idle + @stall
      else
        @wait = [@wall - @cpu, 0.0].max
      end
      @start = nil
      self
    end

    def to_h
      { queue: queue, upstream_queue: upstream_queue, wall: wall, cpu: cpu, gc: gc,
        run: run, idle: idle, stall: stall, wait: wait }
    end

    # The access-log fields, in milliseconds.
    def log_fields
      if gvl_split?
        format("queue=%.2f run=%.2f idle=%.2f stall=%.2f", queue * 1e3, run * 1e3, idle * 1e3, stall * 1e3)
      else
        format("queue=%.2f cpu=%.2f wait=%.2f", queue * 1e3, cpu * 1e3, wait * 1e3)
      end
    end

    # Parses X-Request-Start / X-Queue-Start as proxies send them: "t=" or
    # not, in seconds (with or without a fraction), milliseconds, microseconds
    # or nanoseconds since the epoch. The unit is told by magnitude (epoch
    # seconds are ~1.7e9 today, and < 1e11 until the year 5138).
    module UpstreamQueue
      MAX = 60.0 # seconds; anything above is clamped (clock skew, wrong unit)
      NUMBER = /(\d+(?:\.\d+)?)/.freeze

      # Seconds from the stamp to now_epoch (Float seconds), clamped to
      # 0..MAX; nil when the value holds no number.
      def self.seconds(value, now_epoch)
        stamp = epoch(value)
        return nil if stamp.nil?

        (now_epoch - stamp).clamp(0.0, MAX)
      end

      def self.epoch(value)
        m = NUMBER.match(value)
        return nil if m.nil?

        n = m[1].to_f
        if n >= 1e17 then n / 1e9
        elsif n >= 1e14 then n / 1e6
        elsif n >= 1e11 then n / 1e3
        else n
        end
      end
    end
  end
end

require "serval/timing/recorder"
