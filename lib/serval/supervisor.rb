# frozen_string_literal: true

require "serval/atomic_file"
require "serval/launcher"
require "serval/systemd"
require "serval/boot_state"
require "serval/boot_report"

module Serval
  # The process that supervises: single mode (Single) or the cluster master
  # (Cluster), which inherit everything they do alike from here.
  #
  # #run boots (boot line and report, directory, app, binds, pidfile, the
  # "Listening on" lines), lets the mode start serving, then runs the mode's
  # loop until it sets @done. The loop hands every command (a signal or
  # #enqueue, through the Signals pipe) to #handle, which calls the handler
  # on_<command> (Commands.dispatch). A stop begins in one place (#begin_stop),
  # a hot restart stops gracefully and then execs (#exec_restart), and
  # #cleanup ends it all.
  #
  # A mode defines:
  #   MODE, SIGNALS          its name in the boot line; the signal table it installs
  #   start                  begin serving (bound and announced; called once)
  #   supervise              its loop: until @done, #handle each command
  #   stop_serving(how)      :stop (drain) or :halt, once #begin_stop decided
  #   release                end what start began (cleanup and exec_restart)
  #   update_title           the process title
  # and may override forward(signal) (its workers), keep_listeners_for_exec,
  # process_label, and add on_<command> handlers of its own. Its loop also
  # runs the periodic jobs (#every, and #after's one-shot ones: a
  # deadline): #jobs_timeout bounds its wait and
  # #run_jobs runs what is due; and it waits on the IOs jobs hand it
  # (#watch): #watched_ios joins them to its IO.select and #run_watches
  # calls the block of each that is readable. So a job never waits: it
  # starts something (a request to a child process) and watches for the
  # answer, and the loop serves commands meanwhile.
  class Supervisor
    include BootState

    attr_reader :options, :log_writer, :binder, :app

    # Serval::Events, set by the Launcher (nil in a bare supervisor).
    attr_accessor :events

    def initialize(options, log_writer:, app: nil, signals: true, restart_argv: nil)
      @options = options
      @log_writer = log_writer
      @app = app
      @signals_on = signals
      @restart_argv = restart_argv
      @cwd = Dir.pwd
      @signals = Signals.new
      @status = 0
      @preload = nil # a cluster's preload_app; single mode always loads the app before binding
      @jobs = []
      @watches = [] # replaced, never changed in place: the loop reads it without the lock
      @watch_lock = Mutex.new
      init_boot_state
    end

    # Blocks until stopped; returns the exit status (a hot restart never returns).
    def run
      @signals.install(self.class::SIGNALS) if @signals_on
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

    # The serving Server (single mode only).
    def server = nil

    # Queues a command for the loop, safe from any thread; false (and not
    # queued) when this mode has no handler for it, as single mode for the
    # cluster-only commands.
    def enqueue(command)
      handler = Commands::HANDLERS[command]
      return false unless handler && respond_to?(handler, true)

      @signals.push(command)
    end

    # A periodic job on this process's loop (the main thread): every
    # interval seconds from the loop's first turn after boot. The block must
    # not wait for anything (commands wait behind it): work that can hands
    # itself to a thread. Call it before #run or on the loop; #stop on the
    # returned Job ends it.
    def every(interval, &block)
      raise ArgumentError, "interval must be > 0" unless interval.to_f.positive?

      Job.new(Float(interval), block).tap { |job| @jobs << job }
    end

    # Once, seconds from the loop's next turn: an #every job that stops
    # itself (#stop before it runs cancels it).
    def after(seconds, &block)
      job = every(seconds) do
        job.stop
        block.call
      end
    end

    # One #every job: its next run is set at the loop's first turn.
    Job = Struct.new(:interval, :block, :next_at, :stopped) do
      def stop = self.stopped = true
    end

    # An IO the loop waits on beside its own: the block runs on the loop
    # whenever io is readable (EOF included), until #stop on the returned
    # Watch, or until io is closed. Like a job's, the block must not wait.
    # Call it from the loop (a job) or before #run. Close io only on the
    # loop's thread or once the loop has ended: an IO closed by another
    # thread while IO.select waits on it does not wake it.
    def watch(io, &block)
      raise ArgumentError, "watch needs a block" unless block

      Watch.new(io, block).tap { |w| @watch_lock.synchronize { @watches = [*@watches, w] } }
    end

    # One #watch: #stop ends it (the loop drops it at its next turn).
    Watch = Struct.new(:io, :block, :stopped) do
      def stop = self.stopped = true
    end

    # thread name => backtrace (Array of String) for every thread of this process.
    def thread_backtraces
      Launcher::Support.thread_backtraces
    end

    private

    def boot
      Launcher::Support.remember_log_paths
      Dir.chdir(@options[:directory]) if @options[:directory]
      ENV["RACK_ENV"] = @options[:environment]
      @log_writer.info("Serval #{VERSION} (ruby #{RUBY_VERSION}-p#{RUBY_PATCHLEVEL}) starting in #{self.class::MODE} mode")
      BootReport.lines(@options, preload: @preload).each { |line| @log_writer.info(line) }
      require "serval/server" # the native extension: loaded once, before any fork
      # single mode (@preload nil: no choice) or a preloading cluster
      @app ||= Launcher::Support.load_app(@options[:rackup]) unless @preload == false
      @binder = Binder.new(backlog: @options[:backlog], log_writer: @log_writer)
      @binder.bind(@options[:binds], activated_only: @options[:activated_sockets_only])
      @pidfile = write_pidfile(@options[:pidfile])
      urls.each { |url| @log_writer.info("* Listening on #{url}") }
      @log_writer.info("Use Ctrl-C to stop")
      @started_at = Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ")
      start
      update_title
      change_state(:booted)
    end

    # Seconds until the next job is due (nil: no job).
    def jobs_timeout(t = now)
      @jobs.reject!(&:stopped)
      @jobs.each { |job| job.next_at ||= t + job.interval }
      @jobs.map { |job| [job.next_at - t, 0].max }.min
    end

    # Runs the jobs that are due; a job that raised is logged and goes on.
    def run_jobs(t = now)
      @jobs.each do |job|
        next if job.stopped || job.next_at.nil? || t < job.next_at

        job.next_at += job.interval
        job.next_at = t + job.interval if job.next_at <= t # late by a whole interval: no catching up
        begin
          job.block.call
        rescue StandardError => e
          @log_writer.exception(e, "serval: periodic job failed")
        end
      end
    end

    # The watched IOs still open (stopped and closed ones are dropped).
    def watched_ios
      list = @watches
      return [] if list.empty?

      if list.any? { |w| w.stopped || w.io.closed? }
        @watch_lock.synchronize { @watches = @watches.reject { |w| w.stopped || w.io.closed? } }
        list = @watches
      end
      list.map(&:io)
    end

    # Calls the block of each watch whose IO is in ready; a block that
    # raised is logged and its watch ends.
    def run_watches(ready)
      return if ready.nil? || ready.empty?

      @watches.each do |w|
        next if w.stopped || !ready.include?(w.io)

        begin
          w.block.call
        rescue StandardError => e
          w.stop
          @log_writer.exception(e, "serval: watch failed")
        end
      end
    end

    # IO.select that outlives an IO closed meanwhile (a watched one, by its
    # owner): nothing ready, and the next turn drops it.
    def select_ready(ios, timeout)
      ready, = IO.select(ios, nil, nil, timeout)
      ready
    rescue IOError
      nil
    end

    # Every command, whatever sent it, arrives here.
    def handle(command)
      @log_writer.debug("serval: command #{command}")
      return if Commands.dispatch(self, command)

      @log_writer.info("- #{command} needs cluster mode (workers > 0); ignored") if Commands::CLUSTER_ONLY.include?(command)
    end

    def on_stop = begin_stop(:stop)
    def on_halt = begin_stop(:halt)

    # HUP: stdout/stderr that were redirected to files are reopened here and
    # in every worker.
    def on_reopen_logs
      Launcher::Support.reopen_logs(@log_writer)
      forward("HUP")
    end

    def on_dump_threads
      Launcher::Support.dump_threads(@log_writer, process_label)
      forward(Signals::DUMP_SIGNAL)
    end

    # USR2: stop serving gracefully while the listening sockets stay open (new
    # connections wait in the kernel's backlog), then exec the same command.
    def on_restart
      return @log_writer.info("- Hot restart is not available (no command to exec)") unless @restart_argv
      return @log_writer.info("- Hot restart ignored: already stopping") if @stopping

      @events&.fire(:before_restart)
      keep_listeners_for_exec
      @restarting = true
      begin_stop(:stop)
    end

    # :stop drains within drain_timeout; :halt stops now, also during a drain
    # (a hot restart under way is then given up). A second request of the
    # same kind, or a :stop after :halt, does nothing.
    def begin_stop(how)
      return if @stopping == :halt || (@stopping && how == :stop)

      @restarting = false if how == :halt
      @stopping = how
      Systemd.notify_stopping unless @restarting
      @log_writer.info(how == :halt ? "- Stopping now" : "- Gracefully stopping, waiting up to #{@options[:drain_timeout]}s for requests to finish")
      stop_serving(how)
      on_dump_threads if @options[:shutdown_debug] == true # Puma's shutdown_debug: this process's and the workers'
    end

    # After a restart's drain: the binder's sockets (fd numbers and URLs in
    # SERVAL_INHERITED_FDS) survive the exec and the new process adopts them.
    def exec_restart
      release
      remove_pidfile
      @signals.close
      @log_writer.info("- Restarting: exec #{@restart_argv.join(' ')}")
      $stdout.flush
      $stderr.flush
      Kernel.exec(@binder.inherit_env, *@restart_argv, chdir: @cwd, close_others: false, **@binder.inherit_redirects)
    end

    def cleanup
      release
      @binder&.close
      remove_pidfile
      @signals.close
      @events&.fire_once(:after_stopped) if @state == :booted
      @log_writer.info("- Goodbye!") if @state == :booted
      change_state(:stopped)
    end

    # Serving: systemd is told, and after_booted fires (once per process).
    def announce_ready
      Systemd.notify_ready
      @events&.fire_once(:after_booted)
    end

    # Signals this process passes on to the processes it supervises.
    def forward(_signal) = nil

    # What a restart needs before its drain closes anything (single mode).
    def keep_listeners_for_exec = nil

    def process_label = "serval[#{Process.pid}]"

    # Atomic and exclusive (Serval::AtomicFile), mode 0644.
    def write_pidfile(path)
      return nil unless path

      AtomicFile.write(path, "#{Process.pid}\n", 0o644)
      File.expand_path(path)
    rescue SystemCallError => e
      raise ConfigError, "pidfile: cannot write #{path} (#{e.message})"
    end

    # Only a pidfile that still names this process (a restarted process
    # keeps its pid and writes it again).
    def remove_pidfile
      return unless @pidfile && File.file?(@pidfile)

      File.unlink(@pidfile) if File.read(@pidfile).to_i == Process.pid
    rescue SystemCallError
      nil
    end

    def now
      Launcher::Support.now
    end
  end
end
