# frozen_string_literal: true

require "serval/launcher"
require "serval/systemd"
require "serval/boot_state"
require "serval/boot_report"

module Serval
  # Single mode: one process loads the app, binds, runs the Server and then
  # supervises: one loop reads commands (from signals or #enqueue) off the
  # self-pipe and handles them in a single `case`.
  class Single
    include BootState

    STOPPER_JOIN_TIMEOUT = 5

    attr_reader :options, :log_writer, :server, :binder, :app

    def initialize(options, log_writer:, app: nil, signals: true, restart_argv: nil)
      @options = options
      @log_writer = log_writer
      @app = app
      @signals_on = signals
      @restart_argv = restart_argv
      @cwd = Dir.pwd
      @signals = Signals.new
      init_boot_state
      @status = 0
    end

    def run
      @signals.install(Signals::MASTER.except("CHLD")) if @signals_on
      boot
      supervise
      @status
    rescue Exception
      change_state(:failed) unless booted?
      raise
    ensure
      cleanup
    end

    def urls
      @binder ? @binder.urls : []
    end

    # Commands that need workers: refused here (the control app answers 501;
    # the same signals are logged and ignored by the supervisor loop).
    CLUSTER_ONLY = %i[phased_restart add_worker remove_worker].freeze

    def enqueue(command)
      return false if CLUSTER_ONLY.include?(command)

      super
    end

    # Everything Server#stats reports (the figures a cluster worker sends with
    # its check-in), plus when this process booted.
    def stats
      { started_at: @started_at }.merge(@server ? @server.stats : {})
    end

    # The server's rolling window (Server#window) with processes: 1.
    def window
      w = @server&.window
      w && w.merge(processes: 1, per_process: [{ index: nil, pid: Process.pid, requests: w[:requests] }],
                   missing: [])
    end

    # This process's GVL timeline as Chrome trace-event JSON text.
    def gvl_trace(seconds)
      require "json"
      require "serval/gvl_trace"
      JSON.generate(GVLTrace.record(seconds))
    end

    def thread_backtraces
      Launcher::Support.thread_backtraces
    end

    # What load balancers are told (Serval::Capacity): this process,
    # measured on each call. Called from the agent-check and metrics threads.
    def capacity
      require "serval/capacity"
      state = if @stopper || @halted then :stopping
              elsif !booted? || !@server then :booting
              end
      return Capacity.new(state: state) if state

      load = (@probe ||= Capacity::Probe.new).load(@server)
      Capacity.new(state: load.shedding ? :shedding : :ready, entries: [load])
    end

    private

    def boot
      Launcher::Support.remember_log_paths
      Dir.chdir(@options[:directory]) if @options[:directory]
      ENV["RACK_ENV"] = @options[:environment]
      @log_writer.info("Serval #{VERSION} (ruby #{RUBY_VERSION}-p#{RUBY_PATCHLEVEL}) starting in single mode")
      BootReport.lines(@options).each { |line| @log_writer.info(line) }
      @app ||= Launcher::Support.load_app(@options[:rackup])
      @binder = Binder.new(backlog: @options[:backlog], log_writer: @log_writer)
      @binder.bind(@options[:binds])
      start_server
      @pidfile = Launcher::Support.write_pidfile(@options[:pidfile])
      ProcessTitle.master(@options[:binds], @options[:tag])
      urls.each { |url| @log_writer.info("* Listening on #{url}") }
      @log_writer.info("Use Ctrl-C to stop")
      @started_at = Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")
      change_state(:booted)
      Systemd.notify_ready
    end

    def start_server
      require "serval/server"
      @server = Server.new(@app, @options, log_writer: @log_writer)
      @binder.listeners.each { |l| @server.listen(l.io, l.tls) }
      @server.run
      @server.watch_db_pools
      @watcher = Thread.new do
        Thread.current.name = "serval-watcher"
        @server.join
        @signals.push(:stopped)
      end
    end

    # The one place commands are handled; returns when the process should exit.
    def supervise
      loop do
        @signals.wait(nil).each do |command|
          @log_writer.debug("serval: command #{command}")
          case command
          when :stop then graceful_stop
          when :halt then return fast_stop
          when :stopped then return finished
          when :restart then restart
          when :reopen_logs then Launcher::Support.reopen_logs(@log_writer)
          when :dump_threads then Launcher::Support.dump_threads(@log_writer)
          when :phased_restart, :add_worker, :remove_worker
            @log_writer.info("- #{command} needs cluster mode (workers > 0); ignored")
          end
        end
      end
    end

    def graceful_stop
      return if @stopper

      Systemd.notify_stopping
      @log_writer.info("- Gracefully stopping, waiting up to #{@options[:drain_timeout]}s for requests to finish")
      @stopper = Thread.new do
        Thread.current.name = "serval-stopper"
        @server.stop(@options[:drain_timeout])
      rescue Exception => e
        @log_writer.exception(e, "serval: graceful stop failed")
        @status = 1
      ensure
        @signals.push(:stopped)
      end
    end

    def fast_stop
      @log_writer.info("- Stopping now")
      Systemd.notify_stopping
      @halted = true
      @server.halt
    end

    def finished
      @halted = true unless @stopper # the server ended on its own
      exec_restart if @restarting
    end

    # USR2: drain this server on copies of the listeners (the originals are
    # closed by Server#stop), then exec; the kernel keeps queueing new
    # connections on the inherited sockets meanwhile.
    def restart
      return @log_writer.info("- Hot restart is not available (no command to exec)") unless @restart_argv
      return if @stopper

      @binder.listeners.each { |l| l.io = l.io.dup }
      @restarting = true
      graceful_stop
    end

    def exec_restart
      @watcher&.join(STOPPER_JOIN_TIMEOUT)
      @stopper&.join(STOPPER_JOIN_TIMEOUT)
      Launcher::Support.remove_pidfile(@pidfile)
      @signals.close
      Launcher::Support.exec_restart(@restart_argv, @cwd, @binder, @log_writer)
    end

    def cleanup
      @server.halt if @server && !@stopper && !@halted

      @stopper&.join(STOPPER_JOIN_TIMEOUT)
      @watcher&.join(STOPPER_JOIN_TIMEOUT)
      @binder&.close
      Launcher::Support.remove_pidfile(@pidfile)
      @signals.close
      @log_writer.info("- Goodbye!") if @state == :booted
      change_state(:stopped)
    end
  end
end
