# frozen_string_literal: true

module Serval
  class Timing
    # Per-route samples for the advice's mixed-traffic view: the requests
    # that get a Serval::Timing (1 in every 1/timing_sample_rate) are kept
    # with their route (Timing.route_key) in 10 s buckets like the window's
    # (a reservoir of PER_BUCKET each), and Timing::Window.read adds them as
    # `route_samples`. At most MAX_ROUTES distinct routes per window; the
    # rest are filed as "other". Process-global, as the C window is; #reset
    # after a fork (Recorder#enable).
    module Routes
      SPAN = 10.0
      BUCKETS = 6
      PER_BUCKET = 256
      MAX_ROUTES = 100
      OTHER = "other"

      @mutex = Mutex.new
      @buckets = {} # epoch => [seen, rows]
      @keys = {}    # route => newest epoch it was seen in
      @rng = Random.new

      module_function

      def reset
        @mutex.synchronize do
          @buckets = {}
          @keys = {}
        end
      end

      # One finished request with its Timing (sampled): its route and figures.
      def note(env, timing, now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
        run = timing.run || timing.cpu or return
        idle = timing.run ? timing.idle : timing.wait
        return unless idle

        key = Timing.route_key(env)
        epoch = (now / SPAN).floor
        @mutex.synchronize do
          unless @buckets.key?(epoch) # a new bucket: the old ones and their routes go
            @buckets.delete_if { |e, _| e <= epoch - BUCKETS }
            @keys.delete_if { |_, e| e <= epoch - BUCKETS }
          end
          key = OTHER if @keys.size >= MAX_ROUTES && !@keys.key?(key)
          @keys[key] = epoch
          b = (@buckets[epoch] ||= [0, []])
          b[0] += 1
          row = [key, run, idle, timing.stall || 0.0, timing.wall]
          if b[1].size < PER_BUCKET
            b[1] << row
          elsif (j = @rng.rand(b[0])) < PER_BUCKET
            b[1][j] = row
          end
        end
      end

      # [[rows, seen], ...] of the buckets within the window ending at now, newest first.
      def buckets(now)
        epoch = (now / SPAN).floor
        @mutex.synchronize do
          @buckets.select { |e, _| e > epoch - BUCKETS && e <= epoch }.sort_by { |e, _| -e }.map { |_, (seen, rows)| [rows.dup, seen] }
        end
      end
    end
  end
end
