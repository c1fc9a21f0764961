# frozen_string_literal: true

require "serval/errors"
require "serval/version"

module Serval
  # Runs Puma plugins (`plugin :solid_queue`, `plugin :statsd`, ...) as Puma
  # does: `plugin :name` requires puma/plugin/NAME from the load path when the
  # config file is read (so the config methods it adds to Puma::DSL work in
  # the lines after it) and calls the plugin's #config(dsl); once the
  # launcher runs, each plugin's #start(launcher) is called in the
  # supervising process (single mode, or the cluster master) and the blocks
  # given to #in_background start in threads of their own.
  #
  # The plugin API is the puma gem's own when it loads (a Rails app's bundle
  # keeps puma); otherwise Serval's stand-in, lib/serval/puma_shim, which
  # defines only the names plugins use. Serval never defines a Puma constant
  # while the real gem is loadable.
  #
  # The launcher a plugin sees is a PumaPlugins::Launcher: events (Serval::
  # Events, both Puma's 7/8 and 5/6 names), log_writer (log, write, debug,
  # error, unknown_error), options (Serval's options under Puma's key names,
  # plus what plugin config methods set), stats (Puma's shape), restart,
  # phased_restart, refork, stop, halt. Puma.stats and Puma.stats_hash answer from
  # it.
  module PumaPlugins
    SHIM = File.expand_path("puma_shim", __dir__)

    module_function

    # :puma (the real gem's API) or :serval (the stand-in); loads it once.
    def api
      @api ||= begin
        require "puma"
        require "puma/plugin"
        :puma
      rescue LoadError
        $LOAD_PATH.push(SHIM) unless $LOAD_PATH.include?(SHIM)
        require "puma/plugin"
        :serval
      end
    end

    # A new instance of the plugin registered by puma/plugin/NAME.
    def create(name)
      api
      ::Puma::Plugins.find(name).new
    rescue ::Puma::UnknownPlugin => e
      raise ConfigError, "plugin :#{name}: #{e.message} (puma/plugin/#{name}.rb is not on the load path: " \
                         "is the plugin's gem in the Gemfile?)"
    end

    # True when NAME is a config method a plugin added to Puma::DSL (Puma's
    # own methods are Serval::DSL's business).
    def dsl_method?(name)
      return false unless defined?(::Puma::DSL) && ::Puma::DSL.method_defined?(name)

      file, = ::Puma::DSL.instance_method(name).source_location
      !file.nil? && !file.end_with?("/puma/dsl.rb")
    end

    # Runs a plugin's config method on a Puma::DSL whose @options is the
    # given Hash (what plugins write: `@options[:solid_queue_mode] = ...`).
    def call_dsl(name, options, args, kwargs, block)
      dsl = ::Puma::DSL.allocate
      dsl.instance_variable_set(:@options, options)
      dsl.public_send(name, *args, **kwargs, &block)
    end

    # Starts every plugin instance (options[:puma_plugins]) against the
    # launcher; returns the Launcher the plugins were given (nil: none).
    def start(launcher, events)
      plugins = launcher.options[:puma_plugins] || []
      return nil if plugins.empty?

      host = Launcher.new(launcher, events)
      ::Puma.stats_object = host if ::Puma.respond_to?(:stats_object=)
      plugins.each do |name, plugin|
        launcher.log_writer.debug("serval: starting plugin #{name}")
        plugin.start(host) if plugin.respond_to?(:start)
      end
      ::Puma::Plugins.fire_background
      host
    end

    # Serval's option names that Puma calls otherwise.
    PUMA_NAMES = { drain_timeout: :worker_shutdown_timeout, max_keepalive_requests: :max_keep_alive,
                   preload_app: :preload_app, state_path: :state }.freeze

    # What a Puma plugin's #start receives as `launcher`.
    class Launcher
      attr_reader :events

      def initialize(launcher, events)
        @launcher = launcher
        @events = events
      end

      def log_writer
        @log_writer ||= LogWriter.new(@launcher.log_writer)
      end

      # Serval's options, each also under Puma's name for it, and the values
      # plugin config methods set (options[:plugin_options]).
      def options
        @options ||= begin
          opts = @launcher.options.reject { |k, _| %i[puma_plugins plugin_options sources].include?(k) }
          PUMA_NAMES.each { |ours, theirs| opts[theirs] = opts[ours] if opts.key?(ours) && !opts.key?(theirs) }
          opts.merge(@launcher.options[:plugin_options] || {}).freeze
        end
      end

      def config
        self
      end

      # Puma's stats Hash (symbol keys): single mode's {started_at, backlog,
      # running, pool_capacity, busy_threads, max_threads, requests_count,
      # ...}, cluster mode's {workers, booted_workers, old_workers, phase,
      # worker_status: [{index, pid, booted, last_checkin, last_status}]}.
      # Infinity and NaN become nil, so that Puma.stats (JSON) never fails.
      def stats
        require "serval/json_safe"
        stats = @launcher.stats.merge(versions: { puma: "serval #{VERSION}",
                                                  ruby: { engine: RUBY_ENGINE, version: RUBY_VERSION,
                                                          patchlevel: RUBY_PATCHLEVEL } })
        JSONSafe.convert(stats) { nil }
      end

      def restart = @launcher.enqueue(:restart)
      def phased_restart = @launcher.enqueue(:phased_restart)
      def refork = @launcher.enqueue(:refork)
      def stop = @launcher.stop
      def halt = @launcher.stop(graceful: false)
    end

    # Puma's LogWriter methods over Serval's. #error logs; unlike Puma's it
    # does not exit the process.
    class LogWriter
      def initialize(log_writer)
        @log_writer = log_writer
      end

      def log(message) = @log_writer.info(message.to_s)
      def write(message) = @log_writer.info(message.to_s.chomp)
      def info(message) = log(message)
      def debug(message) = @log_writer.debug(message.to_s)
      def debug? = @log_writer.verbose?
      def error(message) = @log_writer.error("ERROR: #{message}")
      def warn(message) = @log_writer.warn(message.to_s)
      def stdout = $stdout
      def stderr = $stderr

      def unknown_error(error, _request = nil, text = "Unknown error")
        @log_writer.exception(error, text)
      end
    end
  end
end
