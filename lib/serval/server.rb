# frozen_string_literal: true

require "socket"
require "serval/version"
require "serval/errors"
require "serval/native_ext"
require "serval/fairness"
require "serval/thread_pool"
require "serval/request_handler"
require "serval/error_responder"
require "serval/error_log"
require "serval/remote_address"

module Serval
  # One serving process: the native I/O core plus the Ruby thread pool.
  # Create it after fork; #run starts the core's event-loop thread.
  #
  # poll_errors: true leaves the error-response log (ErrorLog) to the
  # caller's loop (#error_log's io, due and drain; Single, a cluster worker)
  # instead of a thread of its own. stopped: called once the server has
  # stopped (#stop, #halt), on the thread that stopped it.
  class Server
    CORE_KEYS = %i[max_request_line max_head max_headers max_body body_spill max_chunk_ext
                   first_data_timeout read_timeout persistent_timeout write_timeout
                   max_connections output_buffer output_budget max_spill max_keepalive_requests min_body_rate
                   max_queue_time tmpdir balance balance_close thread_polls].freeze

    attr_reader :thread_pool, :options, :core # core: the Native::Core (Cluster::Balancer switches it)
    attr_reader :error_log

    def initialize(app, options, log_writer:, poll_errors: false, stopped: nil)
      @app = app
      @options = options
      @log_writer = log_writer
      @core = Native::Core.new(core_options(options))
      @handler = RequestHandler.new(app, options, log_writer)
      @thread_pool = ThreadPool.new(@core, min: options[:min_threads], max: options[:max_threads],
                                           idle_timeout: options[:thread_idle_timeout],
                                           log_writer: log_writer, handler: @handler, hooks: pool_hooks(options))
      @error_log = ErrorLog.new(@core, log_writer, limit: options[:error_log_limit])
      @poll_errors = poll_errors
      @on_stopped = stopped
      auto_parts(options, log_writer)
      timeout_part(options, log_writer)
      @listeners = []
      @state = :new
      @mutex = Mutex.new
      @stopped = ConditionVariable.new
    end

    # tls: a Native::TLSContext for an ssl:// listener, or nil
    def listen(io, tls = nil)
      name, port = listener_address(io)
      tls ? @core.listen(io.fileno, name, port, tls) : @core.listen(io.fileno, name, port)
      @listeners << io
      io
    end

    def run
      @handler.timing&.enable # the GVL hook, once per process (again after fork)
      @core.start
      @error_log.start(poll: @poll_errors)
      start_fairness
      @thread_pool.start
      @tuner&.start
      @io_lane&.start
      @watchdog&.start
      @state = :running
      self
    end

    # Once the app is loaded (Single#boot, each cluster worker): if the app
    # defined ActiveRecord, its pools join the stats (db_pools), requests report
    # pool_wait and a pool smaller than max_threads is warned about. Without
    # Active Record nothing is loaded.
    def watch_db_pools
      return false unless defined?(::ActiveRecord)

      require "serval/db_pools"
      DbPools.after_boot(@options, @log_writer)
    end

    # Graceful: stop accepting, finish queued and in-flight requests within
    # timeout seconds, finish writing responses, then close everything.
    def stop(timeout = @options[:drain_timeout])
      deadline = now + timeout.to_f
      @core.drain
      close_listeners
      stop_auto
      @thread_pool.stop
      stragglers = @thread_pool.join(deadline)
      @core.shutdown([deadline - now, 0].max)
      unless stragglers.empty?
        @log_writer.error("serval: #{stragglers.size} request(s) still running after #{timeout}s, stopping them")
        Launcher::Support.dump_threads(@log_writer, "serval[#{Process.pid}]") if @options[:shutdown_debug] == :on_force && defined?(Launcher::Support)
        @thread_pool.kill
      end
      @error_log.stop
      mark_stopped
    end

    # Fast stop: close every connection now.
    def halt
      @core.drain
      stop_auto
      @thread_pool.stop
      @core.shutdown(0)
      @thread_pool.kill unless @thread_pool.join(now + 1).empty?
      @error_log.stop
      mark_stopped
    end

    def join
      @mutex.synchronize { @stopped.wait(@mutex) until @state == :stopped }
    end

    def stats
      s = @core.stats
      pool = @thread_pool.stats
      { backlog: s[:queued], running: pool[:running], pool_capacity: pool[:pool_capacity],
        busy_threads: pool[:busy_threads], max_threads: pool[:max_threads], min_threads: pool[:min_threads],
        requests_count: s[:requests], connections: s[:connections], accepted: s[:accepted], evicted: s[:evicted],
        rejected: s[:errors], requests_shed: s[:shed], output_buffered_bytes: s[:output_buffered_bytes],
        output_spilled_bytes: s[:output_spilled_bytes], output_spills: s[:output_spills],
        output_waits: s[:output_waits], thread_polls: s[:thread_polls], polled_rounds: s[:polled_rounds],
        polled_waits: s[:polled_waits] }.tap do |h|
        h[:queue_wait_estimate] = s[:queue_wait_estimate] if s.key?(:queue_wait_estimate)
        h[:timing] = @handler.timing.stats if @handler.timing
        h[:fair_preemptions] = Fairness.preemptions if @fairness == :preempt
        h[:auto] = @tuner.stats if @tuner
        h[:io_lane] = @io_lane.stats if @io_lane
        h.merge!(@watchdog.stats) if @watchdog
        h[:oob_gc_runs] = @oob_gc.runs if @oob_gc
        pools = db_pools
        h[:db_pools] = pools if pools
      end
    end

    # The last minute of this process's requests (Timing::Window.read: the
    # shape Serval::Advice::Window takes); nil with timing off.
    def window(now: nil)
      return nil unless @handler.timing

      Timing::Window.read(now: now, max_threads: @thread_pool.stats[:max_threads], db_pools: db_pools,
                          gvl_split: @handler.timing.gvl_split?, timeslice: @fairness ? Fairness.effective_slice : nil)
    end

    # Active Record's pools ({name:, size:, connections:, busy:, idle:,
    # waiting:, dead:} each); nil without Active Record.
    def db_pools
      DbPools.stats if defined?(DbPools)
    end

    private

    def core_options(options)
      core = options.slice(*CORE_KEYS)
      core.merge!(RemoteAddress.core_options(options[:remote_address]))
      core
    end

    # threads :auto (Auto::Tuner) and the I/O lane (Auto::IoLane), when
    # configured; both run beside the pool and stop before it.
    def auto_parts(options, log_writer)
      if options[:threads_auto]
        require "serval/auto/tuner"
        @tuner = Auto::Tuner.new(self, @thread_pool, options, log_writer)
      end
      return unless options[:max_io_threads].to_i.positive?

      require "serval/auto/io_lane"
      @io_lane = Auto::IoLane.new(@thread_pool, max_io_threads: options[:max_io_threads],
                                                idle_after: options[:io_lane_idle], log_writer: log_writer)
    end

    # Puma's thread and out_of_band hooks; oob_gc joins the out_of_band ones.
    def pool_hooks(options)
      hooks = options.slice(:before_thread_start, :before_thread_exit, :out_of_band)
      return hooks unless options[:oob_gc]

      require "serval/oob_gc"
      @oob_gc = OobGc.new(@core, every: options[:oob_gc])
      hooks.merge(out_of_band: [@oob_gc, *hooks[:out_of_band]]) # first: a user hook sees the GC done
    end

    # request_timeout: a watchdog thread, only when set (Single/Worker pass replace_me in a cluster).
    def timeout_part(options, log_writer)
      return unless options[:request_timeout].to_f.positive?

      require "serval/request_timeout"
      @watchdog = RequestTimeoutWatchdog.new(timeout: options[:request_timeout], raise_in_thread: options[:request_timeout_raise],
                                             grace: options[:request_timeout_grace], log_writer: log_writer,
                                             replace_me: options[:replace_me])
      @handler.watchdog = @watchdog
    end

    def stop_auto
      @tuner&.stop
      @io_lane&.stop
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # New connections are refused from here on (the loop no longer accepts).
    # Closing this process's descriptors leaves other processes' copies open.
    def close_listeners
      @listeners.each { |io| io.close unless io.closed? }
    rescue IOError, SystemCallError
      nil
    end

    # The process's GVL slice for request threads (docs/tuning.md), before the
    # threads start: each applies it as it starts. A server whose
    # fair_timeslice is nil (the control app's) leaves it to the serving one.
    def start_fairness
      ms = @options.fetch(:fair_timeslice, 0)
      @fairness = !ms.nil? && Fairness.start(ms)
    end

    def mark_stopped
      Fairness.stop if @fairness
      @watchdog&.stop
      first = @mutex.synchronize do
        was = @state
        @state = :stopped
        @stopped.broadcast
        was != :stopped
      end
      @on_stopped&.call if first
    end

    def listener_address(io)
      addr = io.local_address
      if addr.ip?
        host = addr.ip_address
        host = "[#{host}]" if addr.ipv6?
        [host, addr.ip_port]
      else
        ["localhost", 0]
      end
    end
  end
end
