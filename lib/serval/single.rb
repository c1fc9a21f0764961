# frozen_string_literal: true

require "serval/supervisor"

module Serval
  # Single mode: one process loads the app, binds, runs the Server and
  # supervises it. Boot, commands, restart and cleanup are Supervisor's;
  # here: the Server, the loop and how a stop reaches the Server. The loop,
  # on the main thread, waits on the commands pipe, the Server's error
  # ring (ErrorLog#io) and the IOs its jobs watch (the advice log's model
  # child), and runs the periodic jobs; the Server tells it when
  # it has stopped. No thread of its own but the stopper, during a drain.
  # The cluster-only commands have no handler here, so #enqueue refuses
  # them (the control app answers 501) and their signals are logged and
  # ignored.
  class Single < Supervisor
    MODE = "single"
    SIGNALS = Signals::SINGLE
    JOIN_TIMEOUT = 5 # seconds for the stopper thread at the end

    attr_reader :server

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

    # What load balancers are told (Serval::Capacity): this process,
    # measured on each call. Called from the agent-check and metrics threads.
    def capacity
      require "serval/capacity"
      state = if @stopping || @server_done then :stopping
              elsif !booted? || !@server then :booting
              end
      return Capacity.new(state: state) if state

      load = (@probe ||= Capacity::Probe.new).load(@server)
      Capacity.new(state: load.shedding ? :shedding : :ready, entries: [load])
    end

    private

    def boot
      super
      announce_ready
    end

    def start
      @server = Server.new(@app, @options, log_writer: @log_writer, poll_errors: true,
                                           stopped: -> { @signals.push(:stopped) })
      @binder.listeners.each { |l| @server.listen(l.io, l.tls) }
      @server.run
      @server.watch_db_pools
    end

    def supervise
      errors = @server.error_log
      until @done
        t = now
        ready = select_ready([@signals.reader, errors.io, *watched_ios].compact, [errors.due(t), jobs_timeout(t)].compact.min)
        errors.drain if errors.io
        handle_commands if ready&.include?(@signals.reader)
        run_watches(ready) unless @done
        run_jobs unless @done
      end
    end

    def handle_commands
      @signals.read.each do |command|
        handle(command)
        break if @done
      end
    end

    def update_title
      ProcessTitle.master(@options[:binds], @options[:tag])
    end

    def stop_serving(how)
      return halt_server if how == :halt

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

    def halt_server
      @server.halt
      @done = true
    end

    # The Server ended: drained, halted, or on its own.
    def on_stopped
      @server_done = true
      @done = true
      exec_restart if @restarting
    end

    # Server#stop closes the listeners it serves: it is given copies, and
    # the binder's own sockets survive the exec.
    def keep_listeners_for_exec
      @binder.listeners.each { |l| l.io = l.io.dup }
    end

    def release
      @server.halt if @server && !@stopping && !@server_done
      @stopper&.join(JOIN_TIMEOUT)
    end
  end
end
