# frozen_string_literal: true

require "serval/native_ext"

module Serval
  # Where one request's time went, in seconds: env["serval.timing"], complete
  # from rack.response_finished on. The class and its readers are native
  # (ext/serval/timing.c); this file adds the conveniences.
  #
  #   queue           request complete in Serval's event loop -> app called
  #   upstream_queue  proxy's X-Request-Start / X-Queue-Start stamp -> app
  #                   called (includes queue); nil without the header
  #   wall            app called -> response written to the core's output buffer
  #   cpu             thread CPU time over wall; nil unless this request was
  #                   sampled (timing_sample_rate: the CPU clock is a syscall)
  #   gc              GC time of the whole process over wall (GC.total_time)
  #   run             held the GVL (Ruby 3.2+; nil on 3.1)
  #   idle            without the GVL and not asking for it: I/O, sleep (3.2+)
  #   stall           waiting for the GVL (3.2+)
  #   lock            without the GVL waiting for a Ruby lock: Thread::Mutex,
  #                   Monitor (Logger's), ConditionVariable, Queue/SizedQueue
  #                   (3.3+, told from idle by the GVL hook; nil before)
  #   wait            idle + stall + lock (3.2+); on 3.1 wall - cpu - pool_wait
  #                   when cpu was sampled, where I/O and stall cannot be told apart
  #   pool_wait       blocked checking out an Active Record connection, on
  #                   every Ruby; nil without Active Record. Not part of run,
  #                   idle, stall, lock or wait:
  #                   run + idle + stall + lock + pool_wait = wall
  class Timing
    def to_h
      { queue: queue, upstream_queue: upstream_queue, wall: wall, cpu: cpu, gc: gc,
        run: run, idle: idle, stall: stall, lock: lock, wait: wait, pool_wait: pool_wait }
    end

    # The access-log fields, in milliseconds; upstream= only with a proxy's
    # stamp, lock= only when the request waited for a Ruby lock.
    def log_fields
      locked = lock
      fields = if gvl_split? && locked&.positive?
                 format("queue=%.2f run=%.2f idle=%.2f stall=%.2f lock=%.2f", queue * 1e3, run * 1e3, idle * 1e3,
                        stall * 1e3, locked * 1e3)
               elsif gvl_split?
                 format("queue=%.2f run=%.2f idle=%.2f stall=%.2f", queue * 1e3, run * 1e3, idle * 1e3, stall * 1e3)
               elsif cpu
                 format("queue=%.2f cpu=%.2f wait=%.2f", queue * 1e3, cpu * 1e3, wait * 1e3)
               else
                 format("queue=%.2f wall=%.2f", queue * 1e3, (wall || 0) * 1e3)
               end
      fields = format("%s upstream=%.2f", fields, upstream_queue * 1e3) if upstream_queue
      waited = pool_wait
      waited ? format("%s pool_wait=%.2f", fields, waited * 1e3) : fields
    end

    # A request's route for per-route figures, bounded in length (ROUTE_MAX):
    # Rails' route pattern ("/posts/:id(.:format)") when the router set it,
    # else "Controller#action", else the path without its query and with
    # ids collapsed: numbers, UUIDs and long hex or base64-ish tokens become
    # ":id" ("/posts/42/comments/7" -> "/posts/:id/comments/:id").
    ROUTE_MAX = 120
    ID_SEGMENT = %r{\A(?:\d+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}|
                     (?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,})(?:\.\w{1,8})?\z}xi

    def self.route_key(env)
      method = env["REQUEST_METHOD"].to_s
      pattern = env["action_dispatch.route_uri_pattern"]
      return route_memo(method, pattern) { "#{method} #{pattern}"[0, ROUTE_MAX] } if pattern.is_a?(String) && !pattern.empty?

      params = env["action_dispatch.request.path_parameters"]
      if params.is_a?(Hash) && params[:controller] && params[:action]
        return "#{method} #{params[:controller]}##{params[:action]}"[0, ROUTE_MAX]
      end

      script = env["SCRIPT_NAME"]
      path = script.nil? || script.empty? ? env["PATH_INFO"].to_s : "#{script}#{env['PATH_INFO']}"
      route_memo(method, path) do
        ids = path.split("/", -1).map { |seg| id_segment?(seg) ? ":id" : seg }.join("/")
        "#{method} #{ids.empty? ? '/' : ids}"[0, ROUTE_MAX]
      end
    end

    # The keys made lately, by method and pattern or path (a sampled request
    # costs a lookup instead of building its key): at most ROUTE_MEMO_MAX
    # of at most ROUTE_MEMO_BYTES, then the memo starts over.
    ROUTE_MEMO_MAX = 512
    ROUTE_MEMO_BYTES = 256
    @route_memo = {}
    @route_memos = 0

    def self.route_memo(method, what)
      return yield if what.bytesize > ROUTE_MEMO_BYTES

      by = @route_memo[method] ||= {}
      by[what] || begin
        if (@route_memos += 1) > ROUTE_MEMO_MAX
          @route_memo = {}
          @route_memos = 1
          by = @route_memo[method] = {}
        end
        by[what] = yield.freeze
      end
    end

    # ID_SEGMENT matches only a segment that starts with a digit or is 16
    # bytes or longer: the others (the empty one at a path's start, short
    # words) skip the match (on Ruby 3.3 an empty String sets up the
    # regexp's backtracking cache, thousands of instructions).
    def self.id_segment?(seg)
      first = seg.getbyte(0) or return false
      (seg.bytesize >= 16 || (first >= 48 && first <= 57)) && ID_SEGMENT.match?(seg)
    end

    # X-Request-Start / X-Queue-Start as proxies send them: "t=" or not, in
    # seconds (with or without a fraction), milliseconds, microseconds or
    # nanoseconds since the epoch, told apart by magnitude (parsed in C).
    module UpstreamQueue
      MAX = Timing::UPSTREAM_MAX # seconds; anything above is clamped (clock skew, wrong unit)

      # Seconds from the stamp to now_epoch, clamped to 0..MAX; nil without a number.
      def self.seconds(value, now_epoch)
        stamp = epoch(value)
        stamp && (now_epoch - stamp).clamp(0.0, MAX)
      end

      def self.epoch(value)
        Timing.upstream_epoch(value.to_s)
      end
    end
  end
end

require "serval/timing/recorder"
require "serval/timing/window"
require "serval/timing/routes"

module Serval
  class Timing
    # The Server part (ServerParts) for `timing` (on by default): a
    # Recorder given to the request handler; the GVL hook enabled as the
    # server starts (once per process, again after fork).
    class Part
      def self.attach(server, options, _log_writer)
        recorder = Recorder.new(sample_rate: options.fetch(:timing_sample_rate, 0.05))
        Timing.sample_cap = options.fetch(:timing_sample_cap, 1000)
        server.handler.timing = recorder
        new(recorder)
      end

      def initialize(recorder)
        @recorder = recorder
      end

      def start
        @recorder.enable
        self
      end

      def stop = nil
      def stats = { timing: @recorder.stats }
    end
  end
end
