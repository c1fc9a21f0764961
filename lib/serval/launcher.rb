# frozen_string_literal: true

require "fileutils"
require "io/wait"
require "serval/version"
require "serval/errors"
require "serval/binder"
require "serval/log_writer"

module Serval
  # Single mode: one process. Loads the app, binds, runs the Server and then
  # waits on a self-pipe. Trap handlers only write the signal's name into the
  # pipe; the main loop maps each message to a method through HANDLERS.
  #
  #   launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new)
  #   launcher.run   # blocks until stopped; returns the exit status
  class Launcher
    DUMP_SIGNAL = Signal.list.key?("INFO") ? "INFO" : "PWR"

    # message => method. Signals arrive by name; "stop"/"halt" come from
    # #stop, "stopped" from the thread that waits for the server to finish.
    HANDLERS = {
      "TERM" => :graceful_stop,
      "QUIT" => :graceful_stop,
      "INT" => :fast_stop,
      "HUP" => :reopen_logs,
      DUMP_SIGNAL => :dump_threads,
      "stop" => :graceful_stop,
      "halt" => :fast_stop,
      "stopped" => :finished
    }.freeze

    SIGNALS = %w[TERM QUIT INT HUP].push(DUMP_SIGNAL).freeze
    STOPPER_JOIN_TIMEOUT = 5

    attr_reader :options, :log_writer, :server, :binder, :app

    # options: the frozen hash from Serval::Configuration
    # app:     a Rack app; when nil the rackup file is loaded
    # signals: false leaves the process's trap handlers alone (in-process use)
    def initialize(options, log_writer: LogWriter.new, app: nil, signals: true)
      @options = options
      @log_writer = log_writer
      @app = app
      @signals = signals
      @reader, @writer = IO.pipe
      @state_mutex = Mutex.new
      @state_cond = ConditionVariable.new
      @state = :new
      @status = 0
      @old_traps = {}
    end

    # Boots, serves until told to stop, cleans up. Returns the exit status.
    def run
      install_traps if @signals
      boot
      main_loop
      @status
    rescue Exception # rubocop:disable Lint/RescueException
      change_state(:failed) unless booted?
      raise
    ensure
      cleanup
    end

    # Programmatic stop, safe from any thread (and before boot finished).
    def stop(graceful: true)
      notify(graceful ? "stop" : "halt")
    end

    def booted?
      @state == :booted
    end

    # True once the server listens; false when boot failed or on timeout.
    def wait_until_booted(timeout)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      @state_mutex.synchronize do
        while @state == :new
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          break if left <= 0

          @state_cond.wait(@state_mutex, left)
        end
        @state == :booted
      end
    end

    def urls
      @binder ? @binder.urls : []
    end

    private

    def boot
      Dir.chdir(@options[:directory]) if @options[:directory]
      ENV["RACK_ENV"] = @options[:environment]
      @log_writer.info("Serval #{VERSION} (ruby #{RUBY_VERSION}-p#{RUBY_PATCHLEVEL}) starting in single mode")
      @log_writer.info("* Environment: #{@options[:environment]}")
      @log_writer.info("* Threads: #{@options[:min_threads]}..#{@options[:max_threads]}")
      @app ||= load_app(@options[:rackup])
      @binder = Binder.new(backlog: @options[:backlog])
      @binder.bind(@options[:binds])
      start_server
      write_pidfile
      set_title
      urls.each { |url| @log_writer.info("* Listening on #{url}") }
      @log_writer.info("Use Ctrl-C to stop")
      change_state(:booted)
    end

    def start_server
      require "serval/server"
      @server = Server.new(@app, @options, log_writer: @log_writer)
      @binder.ios.each { |io| @server.listen(io) }
      @server.run
      @watcher = Thread.new do
        Thread.current.name = "serval-watcher"
        @server.join
        notify("stopped")
      end
    end

    # Rack 3 returns the app; Rack 2.2 returns [app, options].
    def load_app(path)
      raise ConfigError, "rackup: #{File.expand_path(path)} not found" unless File.file?(path)

      require "rack"
      require "rack/builder"
      result = Rack::Builder.parse_file(path)
      result.is_a?(Array) ? result.first : result
    end

    def main_loop
      buffer = +""
      loop do
        @reader.wait_readable
        chunk = @reader.read_nonblock(4096, exception: false)
        next if chunk == :wait_readable
        break if chunk.nil?

        buffer << chunk
        while (line = buffer.slice!(/\A[^\n]*\n/))
          return if dispatch(line.chomp) == :exit
        end
      end
    end

    def dispatch(message)
      handler = HANDLERS[message]
      return @log_writer.error("serval: unknown launcher message #{message.inspect}") unless handler

      @log_writer.debug("serval: #{message} -> #{handler}")
      send(handler)
    end

    def graceful_stop
      return if @stopper

      @log_writer.info("- Gracefully stopping, waiting up to #{@options[:drain_timeout]}s for requests to finish")
      @stopper = Thread.new do
        Thread.current.name = "serval-stopper"
        @server.stop(@options[:drain_timeout])
      rescue Exception => e # rubocop:disable Lint/RescueException
        @log_writer.exception(e, "serval: graceful stop failed")
        @status = 1
      ensure
        notify("stopped")
      end
      nil
    end

    def fast_stop
      @log_writer.info("- Stopping now")
      @halted = true
      @server.halt
      :exit
    end

    def finished
      @halted = true unless @stopper # the server ended on its own
      :exit
    end

    # HUP: Serval writes to the inherited stdout/stderr and owns no log file
    # yet, so there is nothing to reopen; the signal is acknowledged only.
    def reopen_logs
      @log_writer.info("- HUP received: no log files to reopen")
      nil
    end

    def dump_threads
      Thread.list.each do |thread|
        @log_writer.error("Thread #{thread.name || thread.object_id} (#{thread.status})\n    " \
                          "#{(thread.backtrace || []).join("\n    ")}")
      end
      nil
    end

    def notify(message)
      @writer.write_nonblock("#{message}\n", exception: false)
    rescue IOError, SystemCallError
      nil
    end

    def install_traps
      SIGNALS.each do |sig|
        next unless Signal.list.key?(sig)

        @old_traps[sig] = Signal.trap(sig) { notify(sig) }
      end
    end

    def restore_traps
      @old_traps.each { |sig, old| Signal.trap(sig, old || "DEFAULT") }
      @old_traps.clear
    end

    def write_pidfile
      path = @options[:pidfile]
      return unless path

      FileUtils.mkdir_p(File.dirname(path))
      tmp = "#{path}.#{Process.pid}.tmp"
      File.write(tmp, "#{Process.pid}\n")
      File.rename(tmp, path)
      @pidfile = File.expand_path(path)
    rescue SystemCallError => e
      raise ConfigError, "pidfile: cannot write #{path} (#{e.message})"
    end

    def remove_pidfile
      return unless @pidfile && File.file?(@pidfile)

      File.unlink(@pidfile) if File.read(@pidfile).to_i == Process.pid
    rescue SystemCallError
      nil
    end

    def set_title
      title = "serval #{VERSION} (#{urls.join(',')})"
      title += " [#{@options[:tag]}]" if @options[:tag]
      Process.setproctitle(title)
    end

    def cleanup
      # main loop left early (an exception): close everything
      @server.halt if @server && !@stopper && !@halted

      @stopper&.join(STOPPER_JOIN_TIMEOUT)
      @watcher&.join(STOPPER_JOIN_TIMEOUT)
      @binder&.close
      remove_pidfile
      restore_traps
      [@reader, @writer].each(&:close)
      @log_writer.info("- Goodbye!") if @state == :booted
      change_state(:stopped)
    end

    def change_state(state)
      @state_mutex.synchronize do
        @state = state
        @state_cond.broadcast
      end
    end
  end
end
