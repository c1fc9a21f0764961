# frozen_string_literal: true

require "socket"
require "serval/version"
require "serval/errors"
require "serval/native_ext"
require "serval/thread_pool"
require "serval/request_handler"
require "serval/error_responder"
require "serval/error_log"
require "serval/remote_address"
require "serval/server_parts"

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
    attr_reader :handler # the RequestHandler (a part may attach to it: ServerParts)
    attr_reader :error_log

    def initialize(app, options, log_writer:, poll_errors: false, stopped: nil)
      @app = app
      @options = options
      @log_writer = log_writer
      @core = Native::Core.new(core_options(options))
      @handler = RequestHandler.new(app, options, log_writer)
      @thread_pool = ThreadPool.new(@core, min: options[:min_threads], max: options[:max_threads],
                                           idle_timeout: options[:thread_idle_timeout],
                                           log_writer: log_writer, handler: @handler,
                                           hooks: options.slice(:before_thread_start, :before_thread_exit, :out_of_band))
      @error_log = ErrorLog.new(@core, log_writer, limit: options[:error_log_limit])
      @poll_errors = poll_errors
      @on_stopped = stopped
      @parts = ServerParts.attach(self, options, log_writer) # timing, fairness, oob_gc, request_timeout, :auto, I/O lane
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
      @core.start
      @error_log.start(poll: @poll_errors)
      @parts.each { |_, part| part.start }
      @thread_pool.start
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
      stop_parts(:drain)
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
      stop_parts(:drain)
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
        @parts.each { |spec, part| spec.stats_key ? h[spec.stats_key] = part.stats : h.merge!(part.stats) }
        pools = db_pools
        h[:db_pools] = pools if pools
      end
    end

    # The last minute of this process's requests (Timing::Window.read: the
    # shape Serval::Advice::Window takes); nil with timing off.
    def window(now: nil)
      timing = @handler.timing or return nil

      Timing::Window.read(now: now, max_threads: @thread_pool.stats[:max_threads], db_pools: db_pools,
                          gvl_split: timing.gvl_split?, timeslice: part(:fairness)&.effective_slice)
    end

    # The attached part of that name (ServerParts::LIST), or nil.
    def part(name)
      @parts.find { |spec, _| spec.name == name }&.last
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

    def stop_parts(moment)
      @parts.each { |spec, part| part.stop if spec.stop_at == moment }
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

    def mark_stopped
      stop_parts(:stopped)
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
