# frozen_string_literal: true

require "securerandom"
require "serval/binder"
require "serval/configuration"
require "serval/state_file"
require "serval/fork_hook"

module Serval
  # What the launcher starts beside the app, in the master (or single)
  # process: the control app (control_url), the Prometheus listener
  # (metrics_bind) and the state file (state_path). Each listener is a small
  # Server of its own with one thread; the control app's has two, so that
  # status/stats answer while another request waits for /advice's model
  # (ControlApp#advice lets one request wait at a time). A forked child closes the inherited
  # listeners at once (ForkHook, installed when this starts), so only the
  # master answers.
  #
  #   control = Serval::Control.after_boot(launcher) if Serval::Control.wanted?(options)
  #   launcher.run   # the control parts start once the launcher has booted
  #   control.stop
  class Control
    # Options for the small servers: one thread, few connections, no bodies,
    # no timing (the histograms are the process's: in single mode they count
    # the application's requests only, and are not reset when these start).
    SERVER_OPTIONS = { min_threads: 1, max_threads: 1, max_connections: 16, max_body: 0,
                       log_requests: false, early_hints: false, lowlevel_error_handler: nil, timing: false,
                       read_timeout: 10.0, first_data_timeout: 10.0, persistent_timeout: 5.0,
                       fair_timeslice: nil }.freeze # nil: the serving Server sets the process's slice
    CONTROL_THREADS = 2
    STOP_GRACE = 1.0
    BOOT_WAIT = 86_400

    @live = []
    @live_mutex = Mutex.new

    class << self
      def wanted?(options)
        options.values_at(:control_url, :metrics_bind, :state_path).any?
      end

      def start(launcher, options, log_writer)
        new(launcher, options, log_writer).start
      end

      # Starts on a thread that waits for the launcher to boot (a handshake,
      # no polling), so the launcher's own boot is untouched.
      def after_boot(launcher)
        new(launcher, launcher.options, launcher.log_writer).start_after_boot
      end

      def track(control)
        @live_mutex.synchronize { @live << control }
      end

      def untrack(control)
        @live_mutex.synchronize { @live.delete(control) }
      end

      # In a forked child: the listeners belong to the parent.
      def after_fork_child
        @live.each(&:forget)
        @live = []
        @live_mutex = Mutex.new
      end
    end

    attr_reader :token, :control_urls, :metrics_urls, :failure

    # advice_runner: what computes /advice (tests: a slow stand-in); default
    # the model's child process.
    def initialize(launcher, options, log_writer, advice_runner: nil)
      @advice_runner = advice_runner
      @launcher = launcher
      @options = options
      @log_writer = log_writer
      @token = options[:control_auth_token] || (SecureRandom.hex(16) if options[:control_url])
      @parts = [] # [binder, server]
      @control_urls = []
      @metrics_urls = []
    end

    def start
      ForkHook.on_child(Control) { Control.after_fork_child } # before any listener exists
      self.class.track(self)
      start_control if @options[:control_url]
      start_metrics if @options[:metrics_bind]
      write_state
      announce
      self
    rescue StandardError
      stop
      raise
    end

    def start_after_boot
      require "serval/threads"
      @starter = Threads.spawn("serval-control", @log_writer) do
        start if @launcher.wait_until_booted(BOOT_WAIT)
      rescue StandardError => e
        @failure = e
        @log_writer.error("serval: control/metrics/state_path failed to start (#{e.message}); stopping")
        @launcher.enqueue(:halt)
      end
      self
    end

    def stop
      @starter.join if @starter && @starter != Thread.current
      @preparer&.join
      self.class.untrack(self)
      @parts.each do |binder, server|
        server&.stop(STOP_GRACE)
        binder.close
      end
      @parts.clear
      @state&.remove
    end

    # Child side of a fork: close our copies of the listeners without
    # unlinking socket files or touching the parent's threads.
    def forget
      @control_app&.forget_model
      @parts.each { |binder, _| binder.ios.each { |io| io.close unless io.closed? } }
      @forgotten = @parts.dup # the Servers stay referenced, never freed here
      @parts.clear
      @state = nil
    end

    private

    def start_control
      require "serval/control_app"
      @control_app = ControlApp.new(@launcher, token: @token, runner: @advice_runner)
      urls = serve(@options[:control_url], @control_app, max_threads: CONTROL_THREADS)
      require "serval/threads"
      @preparer = Threads.spawn("serval-advice-prep", @log_writer) { @control_app.prepare_advice }
      # tools run from elsewhere: tcp:// as in the config, unix paths absolute
      @control_urls = urls.map { |url| url.sub(%r{\Ahttp://}, "tcp://").sub(%r{\Aunix://(.+)}) { "unix://#{File.expand_path(Regexp.last_match(1))}" } }
    end

    def start_metrics
      require "serval/metrics_app"
      @metrics_urls = serve(@options[:metrics_bind], MetricsApp.new(@launcher))
    end

    # After the state file: a line seen means everything is ready.
    def announce
      @metrics_urls.each { |url| @log_writer.info("* Metrics on #{url}/metrics") }
      @log_writer.info("* Control token (generated): #{@token}") if @control_urls.any? && !@options[:control_auth_token]
      @control_urls.each { |url| @log_writer.info("* Control app on #{url}") }
    end

    def serve(uri, app, max_threads: 1)
      require "serval/server"
      binder = Binder.new(backlog: 64)
      part = [binder, nil]
      @parts << part # before bind: a fork from now on closes the listener
      binder.bind([uri])
      server = Server.new(app, Configuration::DEFAULTS.merge(tmpdir: @options[:tmpdir]).merge(SERVER_OPTIONS)
                                                       .merge(max_threads: max_threads),
                          log_writer: @log_writer)
      binder.ios.each { |io| server.listen(io) }
      part[1] = server
      server.run
      binder.urls
    end

    def write_state
      return unless @options[:state_path]

      @state = StateFile.new(@options[:state_path])
      @state.write(pid: Process.pid, control_url: @control_urls.first, control_auth_token: @token,
                   running_from: Dir.pwd)
      # state_permission (Puma's): the file is written 0600, then given this mode
      File.chmod(@options[:state_permission], @state.path) if @options[:state_permission]
    end
  end
end
