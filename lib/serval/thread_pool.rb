# frozen_string_literal: true

require "serval/threads"

module Serval
  # Ruby worker threads that take complete requests from the native core.
  #
  # Threads wait inside Core#next without the GVL. The pool starts with
  # max(min, 1) threads and grows by one whenever a thread takes a request and
  # no other thread is left waiting, up to max; a thread idle for idle_timeout
  # exits while more than min remain. #resize changes min/max at run time (the
  # seam self-tuning uses); surplus threads leave after their current request.
  #
  # The I/O lane (#lane=, set by Auto::IoLane from the requests measured idle
  # in flight) lets the pool run that many threads above max while those
  # requests wait; when it drops, the threads above max + lane leave after
  # their current request, and one waiting for work checks at least every
  # LANE_WAIT seconds, so the pool returns to max without traffic.
  class ThreadPool
    LANE_WAIT = 1.0 # seconds a thread above max waits for work before it checks whether it is surplus

    attr_reader :min, :max, :lane

    # handler: an object whose #call(request) serves it (or a block).
    # hooks: Puma's before_thread_start / before_thread_exit (run in each
    # request thread as it starts and leaves) and out_of_band (run by the
    # thread whose request ended with none other in flight or queued), each
    # an Array of callables; a hook that raises is logged.
    def initialize(core, min:, max:, idle_timeout:, log_writer:, handler: nil, hooks: {}, &block)
      @core = core
      @on_start = hooks[:before_thread_start] unless hooks.fetch(:before_thread_start, []).empty?
      @on_exit = hooks[:before_thread_exit] unless hooks.fetch(:before_thread_exit, []).empty?
      @out_of_band = hooks[:out_of_band] unless hooks.fetch(:out_of_band, []).empty?
      @oob_running = false
      @min = min
      @max = max
      @idle_timeout = idle_timeout
      @log_writer = log_writer
      @handler = handler || block
      @mutex = Mutex.new
      @threads = []
      @serial = 0
      @busy = 0
      @lane = 0
      @stopping = false
    end

    def start
      @mutex.synchronize { spawn_locked while @threads.size < floor }
      self
    end

    # Adds a hook (as `hooks:` above) before the pool starts; first: ahead
    # of the ones given (a Server part: oob_gc runs before the user's
    # out_of_band hooks, so they see the GC done).
    def add_hook(name, hook, first: false)
      ivar = { before_thread_start: :@on_start, before_thread_exit: :@on_exit, out_of_band: :@out_of_band }.fetch(name)
      list = instance_variable_get(ivar) || []
      instance_variable_set(ivar, first ? [hook, *list] : [*list, hook])
    end

    def resize(min, max)
      raise ArgumentError, "threads: min (#{min}) must be <= max (#{max})" if min > max
      raise ArgumentError, "threads: max must be >= 1" if max < 1

      @mutex.synchronize do
        @min = min
        @max = max
        spawn_locked while @threads.size < floor && !@stopping
        # Requests may be queued behind busy threads: one more thread takes
        # one, and grows the pool further from there as usual.
        spawn_locked if @core.waiting.zero? && @threads.size < limit && !@stopping
      end
      self
    end

    # Extra threads allowed above max while requests in flight are idle
    # (the I/O lane). Raising it starts one thread when none is waiting for
    # work (it grows the pool further as usual); lowering it makes the
    # threads above max + lane surplus.
    def lane=(extra)
      raise ArgumentError, "lane must be >= 0" if extra.negative?

      @mutex.synchronize do
        raised = extra > @lane
        @lane = extra
        spawn_locked if raised && @core.waiting.zero? && @threads.size < limit && !@stopping
      end
    end

    def spawned
      @mutex.synchronize { @threads.size }
    end

    def busy
      @busy
    end

    def stats
      @mutex.synchronize do
        { running: @threads.size, busy_threads: @busy, max_threads: @max, min_threads: @min,
          pool_capacity: limit - @busy, io_lane_threads: @lane }
      end
    end

    # Called once the core is draining or stopped: threads leave when Core#next returns nil.
    def stop
      @mutex.synchronize { @stopping = true }
    end

    # Waits until every thread has left or the deadline passes; returns the stragglers.
    def join(deadline)
      threads = @mutex.synchronize { @threads.dup }
      threads.each do |t|
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        t.join([left, 0].max)
      end
      threads.select(&:alive?)
    end

    # Kills the threads still running and waits briefly for their ensure
    # blocks, which close the connections of the requests they held.
    def kill(wait = 1)
      threads = @mutex.synchronize { @threads.dup }
      threads.each(&:kill)
      threads.each { |t| t.join(wait) }
    end

    private

    def floor
      [@min, 1].max
    end

    def limit
      @max + @lane
    end

    def spawn_locked
      @serial += 1
      thread = Threads.spawn("serval-worker-#{@serial}", @log_writer) { work }
      @threads << thread
    end

    # One iteration per request: `while`, not `loop`, so that no block is
    # called per request, and the unlocked pre-checks (plain reads under the
    # GVL) keep method calls off the path while the pool is at its size.
    def work
      run_hooks(:before_thread_start, @on_start) if @on_start
      while true # rubocop:disable Style/InfiniteLoop
        wait = @threads.size > @max ? [LANE_WAIT, @idle_timeout].min : @idle_timeout
        request = @core.next(wait)
        if request.nil?
          break if @stopping || leave_when_idle?(wait)

          next
        end
        grow if @threads.size < @max + @lane && @core.waiting.zero? # unlocked pre-check: grow decides locked
        @busy += 1
        begin
          @handler.call(request)
        ensure
          @busy -= 1
        end
        # Not kept while this thread waits for the next one: the Request holds
        # its env, and through it all the app put there (Rails: the controller,
        # the rendered page). A thread that idles for seconds would keep that
        # alive through the minor GCs into the old generation, and a real app
        # then runs major GCs to free it (bench/NOTES.md "Session 27").
        request = nil
        out_of_band if @out_of_band && @busy.zero?
        break if @threads.size > @max + @lane && surplus?
      end
    ensure
      run_hooks(:before_thread_exit, @on_exit) if @on_exit
      @mutex.synchronize { @threads.delete(Thread.current) }
    end

    # Puma's out_of_band: the process is idle (no request in flight or
    # queued); one thread at a time runs the hooks.
    def out_of_band
      return unless @core.stats[:queued].zero?
      return unless @mutex.synchronize { !@oob_running && (@oob_running = true) }

      begin
        run_hooks(:out_of_band, @out_of_band)
      ensure
        @oob_running = false
      end
    end

    def run_hooks(name, hooks)
      hooks.each do |hook|
        hook.call
      rescue StandardError => e
        @log_writer.exception(e, "serval: #{name} hook failed")
      end
    end

    def grow
      @mutex.synchronize { spawn_locked if @threads.size < limit && !@stopping }
    end

    # After a wait of `waited` seconds with no work: leave when surplus, or
    # after a full idle_timeout while more than min remain.
    def leave_when_idle?(waited)
      @mutex.synchronize do
        leave = @threads.size > limit || (waited >= @idle_timeout && @threads.size > floor)
        @stopping || (leave && @threads.delete(Thread.current) && true)
      end
    end

    # Checked after every request: the unlocked read (an Array's size, under
    # the GVL) keeps the mutex off the hot path; the decision is made locked.
    def surplus?
      return false unless @threads.size > limit

      @mutex.synchronize { @threads.size > limit && @threads.delete(Thread.current) && true }
    end
  end
end
