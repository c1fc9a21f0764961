# frozen_string_literal: true

require "fileutils"
require "rbconfig"
require "serval/version"
require "serval/errors"
require "serval/binder"
require "serval/log_writer"
require "serval/signals"
require "serval/process_title"
require "serval/events"

module Serval
  # The entry point: picks single mode (workers 0) or cluster mode (a master
  # and forked workers) and forwards to it.
  #
  #   launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new)
  #   launcher.run          # blocks until stopped; returns the exit status
  #   launcher.enqueue(:phased_restart)   # from any thread
  #   launcher.stats        # Puma-format stats Hash
  class Launcher
    # Commands for #enqueue; the signals in Signals::MASTER map to the same ones.
    COMMANDS = Commands::NAMES

    attr_reader :mode

    # options:      the frozen hash from Serval::Configuration
    # app:          a Rack app; when nil the rackup file is loaded
    # signals:      false leaves the process's trap handlers alone (in-process use)
    # restart_argv: the command a hot restart (USR2) execs; nil disables it
    def initialize(options, log_writer: LogWriter.new, app: nil, signals: true, restart_argv: nil)
      Support.refuse_mn_threads
      @mode = options.fetch(:workers, 0).positive? ? :cluster : :single
      log_writer.configure(options) if log_writer.respond_to?(:configure) # log_formatter, custom_logger
      app ||= options[:app] # a config file's `app { }`
      require "serval/#{@mode}"
      mode_class = @mode == :cluster ? Cluster : Single # both Serval::Supervisor
      require "serval/state_file" # a process's own server: the app's tmp/serval.state by default
      options = StateFile.with_default(options) if signals
      @impl = mode_class.new(options, log_writer: log_writer, app: app, signals: signals, restart_argv: restart_argv)
      @events = Events.new(log_writer)
      Events::NAMES.each { |name| options.fetch(name, []).each { |hook| @events.register(name, hook) } }
      @impl.events = @events
    end

    # Puma's lifecycle events (Serval::Events): config hooks and plugins
    # register here; the supervisor fires them.
    attr_reader :events

    # The control app, metrics listener and state file (Serval::Control)
    # and the plugins (Serval::Plugins) start once booted and stop after the
    # mode's own cleanup.
    def run
      Support.redirect_output(options)
      Support.sync_output if options.fetch(:stdout_sync, true)
      Support.export_auto_threads(options, log_writer)
      require "serval/control"
      control = Control.after_boot(self) if Control.wanted?(options)
      agent = start_agent_check
      plugins = start_plugins
      start_puma_plugins
      advice_log = start_advice_log
      idle = start_idle_timeout
      status = @impl.run
      failure = control&.failure
      raise ConfigError, "control/metrics/state_path could not start: #{failure.message}" if failure

      status
    ensure
      idle&.stop
      plugins&.each(&:stop)
      advice_log&.stop
      control&.stop
      agent&.stop
    end

    def booted? = @impl.booted?
    def wait_until_booted(timeout) = @impl.wait_until_booted(timeout)
    def urls = @impl.urls
    def options = @impl.options
    def log_writer = @impl.log_writer
    def binder = @impl.binder
    def app = @impl.app
    def stats = @impl.stats

    # What load balancers are told (Serval::Capacity): HAProxy's agent-check
    # (agent_check_url) and GET /ready on the metrics listener.
    def capacity = @impl.capacity

    # Single mode's Server; nil in cluster mode (the workers have theirs).
    def server = @impl.server

    # Programmatic stop, safe from any thread (and before boot finished).
    def stop(graceful: true)
      enqueue(graceful ? :stop : :halt)
    end

    # A periodic job on the supervising loop (Supervisor#every): the advice
    # log's checks.
    def every(interval, &block) = @impl.every(interval, &block)

    # An IO the supervising loop waits on (Supervisor#watch): the advice
    # log's model child.
    def watch(io, &block) = @impl.watch(io, &block)

    def enqueue(command)
      raise ArgumentError, "unknown launcher command #{command.inspect}" unless COMMANDS.include?(command)

      @impl.enqueue(command)
    end

    # The advice log line (Serval::AdviceLog), once the launcher can give a
    # measurement window.
    private def start_advice_log
      require "serval/advice_log"
      AdviceLog.after_boot(self) if AdviceLog.wanted?(self)
    end

    # Listens from before boot, so HAProxy hears "down #booting" meanwhile.
    private def start_agent_check
      return nil unless options[:agent_check_url]

      require "serval/agent_check"
      AgentCheck.start(self, options[:agent_check_url], log_writer)
    end

    # idle_timeout: a graceful stop after that long without a request.
    private def start_idle_timeout
      return nil unless options[:idle_timeout]

      require "serval/idle_timeout"
      IdleTimeout.new(self, options[:idle_timeout]).start
    end

    private def start_plugins
      return nil if options.fetch(:plugins, []).empty?

      require "serval/plugins"
      Plugins.start(self)
    end

    # Puma plugins (`plugin :solid_queue`, lib/serval/puma_plugins.rb): loaded
    # with the config file, started here, in the supervising process.
    private def start_puma_plugins
      return nil if options.fetch(:puma_plugins, []).empty?

      require "serval/puma_plugins"
      PumaPlugins.start(self, @events)
    end

    # Single: thread name => backtrace (Array of String) for every thread;
    # cluster: the master's and each worker's (Cluster#thread_backtraces).
    def thread_backtraces = @impl.thread_backtraces

    # A GVL trace of this process, or in cluster mode of every worker merged,
    # as Chrome trace-event JSON text; NotImplementedError before Ruby 3.2.
    def gvl_trace(seconds) = @impl.gvl_trace(seconds)

    # The last minute of requests (Serval::Timing::Window's shape, which
    # Serval::Advice::Window reads): the server's in single mode; in cluster
    # mode every worker's, merged, with per_process and missing workers.
    def window = @impl.window

    # Cluster mode: the window without waiting (Cluster#window_later); the
    # block runs on the supervising loop.
    def window_later(...) = @impl.window_later(...)

    # Helpers of the supervising process (Supervisor) that a cluster worker
    # uses too.
    module Support
      module_function

      # Ruby 3.3's M:N threads (RUBY_MN_THREADS=1; RUBY_DESCRIPTION then
      # says +MN) run several Ruby threads on one native thread. Serval's
      # native core keeps per-thread state in native threads (the GVL
      # hook's timing, thread polls), so it refuses to start rather than
      # measure and schedule wrongly.
      def refuse_mn_threads(description = RUBY_DESCRIPTION)
        return unless description.include?(" +MN ")

        raise ConfigError, "RUBY_MN_THREADS=1 (Ruby's M:N threads) is not supported: Serval's native core keeps " \
                           "per-thread state that needs one native thread per Ruby thread. Unset RUBY_MN_THREADS " \
                           "(or set it to 0) and start again"
      end

      # Every write to stdout/stderr reaches the pipe or file at once (Puma
      # does the same): without it an app's log lines on a pipe (Docker,
      # systemd) wait in Ruby's buffer until it fills or the process exits.
      def sync_output
        [$stdout, $stderr, STDOUT, STDERR].uniq.each { |io| io.sync = true unless io.closed? }
      end

      def thread_backtraces
        Thread.list.each_with_index.to_h do |thread, i|
          ["#{thread.name || "thread-#{i}"} (#{thread.status || 'dead'})", thread.backtrace || []]
        end
      end

      # RAILS_MAX_THREADS=auto: an app's database.yml sizes its pool from
      # that variable ("auto".to_i is 0: no connections at all). Before the
      # app loads, it becomes threads_auto_max, the most threads auto may
      # run, so the pool covers every count the controller can choose.
      def export_auto_threads(options, log_writer, env = ENV)
        return unless options[:threads_auto]

        require "serval/env_config"
        %w[RAILS_MAX_THREADS PUMA_MAX_THREADS MAX_THREADS].each do |name|
          # "auto", or the number EnvConfig.export_auto put there before the config file ran
          next unless env[name].to_s.strip == "auto" || (env[name] && EnvConfig.exported[name] == env[name])

          env[name] = options[:threads_auto_max].to_s
          log_writer.info("* #{name}=auto: the app sees #{name}=#{env[name]} (threads_auto_max), " \
                          "so a pool sized from it covers every thread count auto may choose")
        end
      end

      def dump_threads(log_writer, who)
        thread_backtraces.each do |name, trace|
          log_writer.error("#{who} thread #{name}\n    #{trace.join("\n    ")}")
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

      # stdout_redirect: $stdout/$stderr (fds 1 and 2, so workers and
      # children inherit them) reopened on files before the boot lines. A hot
      # restart appends even without append: it must not truncate its own log.
      def redirect_output(options, env = ENV)
        append = options[:redirect_append] || env.key?("SERVAL_INHERITED_FDS")
        { $stdout => options[:redirect_stdout], $stderr => options[:redirect_stderr] }.each do |io, path|
          next unless path

          io.reopen(File.expand_path(path), append ? "a" : "w")
          io.sync = true
        rescue SystemCallError, IOError => e
          raise ConfigError, "stdout_redirect: cannot open #{path} (#{e.message})"
        end
      end

      # The files stdout/stderr point to at boot (nil: a terminal or a pipe).
      def remember_log_paths
        @log_paths = [$stdout, $stderr].to_h do |io|
          path = File.readlink("/proc/self/fd/#{io.fileno}")
          [io, File.file?(path) ? path : nil]
        rescue SystemCallError, IOError
          [io, nil]
        end
      end

      # HUP: stdout/stderr redirected to regular files at boot are reopened by
      # that name (append), so a rotated log file is let go.
      def reopen_logs(log_writer)
        reopened = (@log_paths || {}).filter_map do |io, path|
          next unless path

          io.reopen(path, "a")
          io.sync = true
          path
        rescue SystemCallError, IOError
          nil
        end
        log_writer.info("- Reopened #{reopened.uniq.join(', ')}") unless reopened.empty?
        reopened
      end

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
