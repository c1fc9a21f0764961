# frozen_string_literal: true

module Serval
  class Timing
    # Major GCs over a window, for the advice: GC.stat snapshots taken as
    # windows are read (the advice log, `threads :auto`, /advice), and the
    # difference between now and the oldest snapshot inside the window's
    # span. Nothing runs per request or on a timer of its own.
    #
    #   { seconds:, collections:, majors:, gc_time: (seconds or nil),
    #     nofree: (majors forced because a heap had no free slots after a
    #     minor GC, Ruby 3.3+; nil before), heap: {index:, slot_size:, slots:}
    #     (the heap that forced most of them; nil without any) }
    #
    # Ruby 3.3 grows a heap after a major GC only when the major itself
    # freed too little; a small heap that a fast allocator fills with
    # objects promoted by frequent minor GCs never does, and runs
    # major after major (bench/NOTES.md "Session 33").
    class GcRecord
      MIN_SECONDS = 10.0 # a figure needs snapshots at least this far apart
      KEEP = 300.0       # seconds of snapshots kept

      # The process's counters now.
      def self.stat
        s = GC.stat
        heaps = GC.respond_to?(:stat_heap) ? GC.stat_heap : {}
        { count: s[:count], major: s[:major_gc_count], time: s[:time],
          heaps: heaps.map { |i, h| [i, h[:force_major_gc_count], h[:slot_size], h[:heap_eden_slots]] } }
      end

      def initialize(clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }, source: -> { GcRecord.stat })
        @clock = clock
        @source = source
        @snaps = []
        @lock = Mutex.new
      end

      # Takes a snapshot at `now` (monotonic seconds) and answers the figures
      # from the oldest snapshot at most `span` seconds old (and at least
      # MIN_SECONDS), nil without one.
      def read(span, now: nil)
        now ||= @clock.call
        stat = @source.call
        @lock.synchronize do
          base = @snaps.find { |t, _| now - t <= [span, MIN_SECONDS].max && now - t >= MIN_SECONDS }
          @snaps << [now, stat]
          @snaps.shift while @snaps.size > 1 && now - @snaps.first[0] > KEEP
          base && figures(now - base[0], base[1], stat)
        end
      end

      private

      def figures(seconds, was, now)
        time = now[:time] && was[:time] ? (now[:time] - was[:time]) / 1e3 : nil
        forced = forced(was[:heaps], now[:heaps])
        top = forced&.max_by { |f| f[1] }
        { seconds: seconds.round(3), collections: now[:count] - was[:count], majors: now[:major] - was[:major],
          gc_time: time&.round(3), nofree: forced&.sum { |f| f[1] },
          heap: top && top[1].positive? ? { index: top[0], slot_size: top[2], slots: top[3] } : nil }
      end

      # [index, forced majors in between, slot size, slots now] per heap;
      # nil where Ruby does not count them (before 3.3).
      def forced(was, now)
        return nil if now.nil? || now.empty? || now.any? { |h| h[1].nil? }

        before = was.to_h { |i, f, *| [i, f.to_i] }
        now.map { |i, f, size, slots| [i, f - before.fetch(i, 0), size, slots] }
      end
    end
  end
end
