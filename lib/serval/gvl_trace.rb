# frozen_string_literal: true

require "serval/native_ext"

module Serval
  # A GVL timeline of this process as Chrome trace-event JSON (open it in
  # Perfetto or chrome://tracing): one track per thread with "running",
  # "waiting for GVL" and "idle" slices, and the requests the thread served
  # (method and path, measured ones only: timing on, sampled) as enclosing
  # slices on the same track. The GVL hook records into a fixed native buffer
  # (Native::GVL::TRACE_CAPACITY events); past that, events are dropped and
  # counted in otherData.dropped_events.
  module GVLTrace
    STATES = ["running", "idle", "waiting for GVL"].freeze # index = native state
    MAX_SECONDS = 300.0

    @lock = Mutex.new
    @recording = nil

    class << self
      # The list request notes go to while a trace records, else nil.
      attr_reader :recording

      # Records for `seconds` and returns the trace: a Hash that JSON.generate
      # turns into the file Perfetto opens. Timestamps (microseconds) count
      # from origin_ns on the monotonic clock (default: the trace's start);
      # that clock is system-wide, so traces of several processes given one
      # origin line up.
      def record(seconds, origin_ns: nil)
        check_supported
        seconds = Float(seconds)
        raise ArgumentError, "seconds must be in (0, #{MAX_SECONDS}]" unless seconds.positive? && seconds <= MAX_SECONDS

        @lock.synchronize { capture(seconds, origin_ns) }
      end

      def check_supported
        return if Native::GVL.supported?

        raise NotImplementedError, "GVL tracing needs Ruby 3.2+ (the GVL event hook); this is Ruby #{RUBY_VERSION}"
      end

      # A worker's part of a merged trace: [otherData, its events as JSON
      # text] (the master splices the text without parsing it).
      def record_part(seconds, origin_ns:)
        require "json"
        trace = record(seconds, origin_ns: origin_ns)
        [trace[:otherData], JSON.generate(trace[:traceEvents].reject { |e| e[:name] == "process_name" })]
      end

      # The merged trace as JSON text, from the workers' parts:
      # answers [{index:, pid:, result: otherData, payload: events JSON}];
      # one process per worker, named "worker N"; missing (the workers that
      # did not answer, [{index:, pid:, error:}]) goes into otherData.
      def merge(answers, missing)
        require "json"
        missing = missing.dup
        parts = []
        workers = []
        answers.each do |answer|
          events = answer[:payload].to_s
          unless events.start_with?("[") && events.end_with?("]")
            missing << { index: answer[:index], pid: answer[:pid], error: "sent no trace events" }
            next
          end
          parts << events[1...-1] unless events == "[]"
          workers << { index: answer[:index], pid: answer[:pid], **answer[:result].to_h.slice(:seconds, :dropped_events) }
        end
        meta = workers.flat_map do |w|
          [{ name: "process_name", ph: "M", pid: w[:pid], tid: 0, args: { name: "worker #{w[:index]}" } },
           { name: "process_sort_index", ph: "M", pid: w[:pid], tid: 0, args: { sort_index: w[:index] } }]
        end
        other = { seconds: workers.map { |w| w[:seconds] }.compact.max, ruby: RUBY_VERSION,
                  dropped_events: workers.sum { |w| w[:dropped_events].to_i }, workers: workers, missing: missing }
        events = [JSON.generate(meta)[1...-1], *parts].reject(&:empty?).map(&:b).join(",")
        text = "{\"traceEvents\":[".b << events << "],\"displayTimeUnit\":\"ms\",\"otherData\":" << JSON.generate(other).b << "}"
        text.force_encoding(Encoding::UTF_8)
      end

      # Called by Timing::Recorder#finish while recording.
      def note(timing, env)
        notes = @recording
        notes << [Thread.current.native_thread_id, timing.started_ns, timing.finished_ns,
                  "#{env['REQUEST_METHOD']} #{env['PATH_INFO']}"] if notes
      end

      private

      def capture(seconds, origin_ns)
        Native::GVL.enable
        notes = []
        start = Native::GVL.trace_start
        @recording = notes
        begin
          sleep seconds
        ensure
          @recording = nil
          stop, dropped, flat = Native::GVL.trace_stop
        end
        render(start, stop, dropped, flat, notes, origin_ns || start)
      end

      def render(start, stop, dropped, flat, notes, origin)
        pid = Process.pid
        states = Hash.new { |h, k| h[k] = [] }
        flat.each_slice(3) { |ts, tid, state| states[tid] << [ts, state] }
        requests = notes.group_by(&:first)
        names = thread_names
        events = [{ name: "process_name", ph: "M", pid: pid, tid: 0, args: { name: "serval #{pid}" } }]
        (states.keys | requests.keys).sort.each do |tid|
          events << { name: "thread_name", ph: "M", pid: pid, tid: tid, args: { name: names[tid] || "thread #{tid}" } }
          reqs = (requests[tid] || []).map { |_, s, e, label| [[s, start].max, [e, stop].min, label] }
                                      .select { |s, e, _| e > s }
          events.concat(track(pid, tid, segments(states[tid], stop, reqs), reqs, origin))
        end
        { traceEvents: events, displayTimeUnit: "ms",
          otherData: { seconds: (stop - start) / 1e9, dropped_events: dropped, ruby: RUBY_VERSION } }
      end

      def thread_names
        Thread.list.to_h { |t| [t.native_thread_id, t.name || t.inspect] }
      end

      # [[from, to, state]], consecutive states merged, split at request edges
      # so that every state slice nests inside or outside each request.
      def segments(events, stop, reqs)
        merged = []
        events.sort_by(&:first).each do |ts, state|
          next if merged.last && merged.last[2] == state

          merged.last[1] = ts if merged.last
          merged << [ts, stop, state]
        end
        cuts = reqs.flat_map { |s, e, _| [s, e] }.sort
        merged.flat_map do |from, to, state|
          inner = cuts.select { |c| c > from && c < to }
          edges = [from, *inner, to]
          edges.each_cons(2).filter_map { |a, b| [a, b, state] if b > a }
        end
      end

      # B/E events, ordered so they nest: at one instant a state ends before
      # a request ends, and a request begins before a state begins.
      def track(pid, tid, segs, reqs, origin)
        marks = []
        segs.each do |a, b, state|
          marks << [a, 3, "B", STATES[state], "gvl"] << [b, 0, "E", STATES[state], "gvl"]
        end
        reqs.each do |a, b, label|
          marks << [a, 2, "B", label, "request"] << [b, 1, "E", label, "request"]
        end
        marks.sort_by! { |ts, order, *| [ts, order] }
        marks.map do |ts, _, ph, name, cat|
          { name: name, cat: cat, ph: ph, pid: pid, tid: tid, ts: ((ts - origin) / 1e3).round(3) }
        end
      end
    end
  end
end
