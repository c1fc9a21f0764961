# frozen_string_literal: true

require "json"
require "serval/launcher"
require "serval/cluster/command_channel"
require "serval/cluster/balancer"
require "serval/json_safe"
require "serval/supervisor"
require "serval/replace_worker"
require "serval/cluster/mold"

module Serval
  class Cluster < Supervisor
    # One worker process, after fork: runs the hooks, starts its own Server
    # (native core and thread pool start here, never in the master), checks in
    # with the master every worker_check_interval seconds with its stats,
    # answers the master's requests (CommandChannel) and stops gracefully on
    # TERM or when the master's end of the command channel closes. One loop
    # on the main thread does all of it, and also drains the Server's error
    # ring (ErrorLog#io) and runs the Balancer's ticks: no thread of its own.
    class Worker
      def initialize(index:, options:, app:, binder:, log_writer:, status_io:, control_io:, load_table: nil)
        @index = index
        @load_table = load_table
        @options = options
        @app = app
        @binder = binder
        @log_writer = log_writer
        @status_io = status_io
        @control_io = control_io
        commands = COMMANDS.merge(window: ->(_request) { @server&.window },
                                  mold: lambda do |_request|
                                    @signals.push(:mold) # the loop stops serving, then runs the Mold
                                    true
                                  end)
        @responder = CommandChannel::Responder.new(control_io, commands, log_writer)
        @signals = Signals.new
      end

      # In a process just forked (by the master or the mold): closes the
      # parent's descriptors and signal pipe (its handlers stay until the
      # worker's replace them, Signals#detach), runs a Worker and exits
      # with its status.
      def self.main(close_ios, signals, index:, log_writer:, **args)
        code = 1
        begin
          close_ios.each { |io| io.close unless io.closed? }
          signals.detach # the master's handlers keep what comes until #run installs the worker's
          code = new(index: index, log_writer: log_writer, **args).run
        rescue Exception => e # rubocop:disable Lint/RescueException
          log_writer.exception(e, "serval: worker #{index} failed")
        end
        $stdout.flush
        $stderr.flush
        Process.exit!(code)
      end

      # What the master may ask (on a thread of the worker's own), besides
      # `window` (this worker's Server#window) and `mold` (stop serving and
      # become the mold new workers fork from: Mold, fork_worker).
      COMMANDS = {
        trace: lambda do |request|
          require "serval/gvl_trace"
          CommandChannel::Bulk.new(*GVLTrace.record_part(request[:seconds], origin_ns: request[:origin_ns]))
        end,
        backtraces: ->(_request) { Launcher::Support.thread_backtraces }
      }.freeze

      # Returns the exit status.
      def run
        @signals.install(Signals::WORKER)
        @signals.replay_early(Commands::WORKER) # a TERM that came as this worker started stops it
        ProcessTitle.worker(@index, @options[:tag], nil)
        run_hooks(:before_worker_boot, @index)
        start_server
        checkin(booted: true)
        supervise
      ensure
        @signals.close
      end

      private

      def start_server
        require "serval/server"
        app = @loaded_app = @app || Launcher::Support.load_app(@options[:rackup])
        replace_me = lambda do |reason|
          @replace_reason ||= reason.to_s
          @signals.push(:replace_me) # wakes the loop, which checks in at once
        end
        Serval.replace_worker = replace_me
        @server = Server.new(app, @options.merge(balance: true, balance_close: @options[:gvl_balance], replace_me: replace_me),
                             log_writer: @log_writer, poll_errors: true)
        @binder.listeners.each { |l| @server.listen(l.io, l.tls) }
        @server.run
        @server.watch_db_pools
        start_balancer
      end

      # The load this worker publishes for its siblings and the master, and
      # GVL-aware balancing (gvl_balance) against the siblings it finds:
      # Balancer#tick every Balancer::TICK seconds, from the loop.
      def start_balancer
        return unless @load_table

        @balancer = Balancer.new(server: @server, table: @load_table, index: @index, log_writer: @log_writer,
                                 interval: @options[:gvl_balance_interval], enabled: @options[:gvl_balance])
        @next_tick = Launcher::Support.now
      end

      # Until a stop: the master's signals (Signals::WORKER, each handled by
      # its on_<command>, Commands.dispatch), its requests, check-ins, the
      # error ring and the balancer's ticks.
      def supervise
        interval = @options[:worker_check_interval]
        next_checkin = Launcher::Support.now + interval
        errors = @server.error_log
        until @code
          t = Launcher::Support.now
          wait = [next_checkin - t, errors.due(t), @next_tick && @next_tick - t].compact.min
          ready, = IO.select([@signals.reader, @control_io, errors.io].compact, nil, nil, [wait, 0].max)
          errors.drain if errors.io
          if ready&.include?(@control_io) && !@responder.read
            @log_writer.info("- Worker #{@index} (PID: #{Process.pid}): master is gone, stopping")
            on_stop
          end
          @signals.read.each { |command| Commands.dispatch(self, command) unless @code } if ready&.include?(@signals.reader)
          balance_tick unless @code
          if !@code && (Launcher::Support.now >= next_checkin || (@replace_reason && !@replace_sent))
            @replace_sent = true if @replace_reason
            checkin
            next_checkin = Launcher::Support.now + interval
          end
        end
        @code
      end

      # A bad tick must not end balancing for the worker's life: logged once, ticks go on.
      def balance_tick
        t = Launcher::Support.now
        return unless @next_tick && t >= @next_tick

        @next_tick += Balancer::TICK
        @next_tick = t + Balancer::TICK if @next_tick <= t # late by a whole tick: no catching up
        @balancer.tick(t)
      rescue StandardError => e
        @log_writer.error("serval: balance tick failed (#{e.class}: #{e.message})") unless @balance_failed
        @balance_failed = true
      end

      def on_stop
        run_hooks(:before_worker_shutdown, @index)
        @next_tick = nil
        @balancer&.stop
        @server.stop(@options[:drain_timeout])
        @code = 0
      end

      # The master chose this worker as the mold (refork): it drains like a
      # stop, keeping copies of the listeners for the workers it will fork.
      def on_mold
        listeners = @binder.listeners.map { |l| l.dup.tap { |c| c.io = l.io.dup } }
        @log_writer.info("- Worker #{@index} (PID: #{Process.pid}) stops serving to become the mold")
        @next_tick = nil
        @balancer&.stop
        @server.stop(@options[:drain_timeout])
        @code = Mold.new(index: @index, options: @options, app: @loaded_app, listeners: listeners, log_writer: @log_writer,
                         status_io: @status_io, control_io: @control_io, load_table: @load_table, signals: @signals).run
      end

      def on_halt
        @next_tick = nil
        @balancer&.stop
        @server.halt
        @code = 0
      end

      def on_reopen_logs = Launcher::Support.reopen_logs(@log_writer)
      def on_dump_threads = Launcher::Support.dump_threads(@log_writer, "worker #{@index} [#{Process.pid}]")

      # One JSON line; skipped (not blocked on) when the master is not reading.
      def checkin(booted: false)
        stats = @server.stats
        stats = stats.merge(@balancer.stats) if @balancer
        stats = stats.merge(recycle: @replace_reason) if @replace_reason
        ProcessTitle.worker(@index, @options[:tag], stats)
        line = JSON.generate(pid: Process.pid, index: @index, booted: booted, status: JSONSafe.convert(stats) { nil }) # no Infinity/NaN in JSON
        @status_io.write_nonblock("#{line}\n", exception: false)
      rescue IOError, SystemCallError
        nil
      end

      def run_hooks(key, *args)
        @options[key].each { |hook| hook.call(*args) }
      end
    end
  end
end
