# frozen_string_literal: true

require "rbconfig"
require "shellwords"
require "serval/configuration"
require "serval/dsl"
require "serval/log_writer"
require "serval/launcher"

module Serval
  # The body of the Rack/Rackup handlers (`rackup -s serval`, `bin/rails
  # server -u serval`): turns handler options into Serval options and runs a
  # Launcher. The layers are those of the command line (docs/configuration.md):
  # handler options > config file (config/serval.rb, else config/puma.rb, ...)
  # > environment variables > defaults. Rails says which options the user
  # typed (:user_supplied_options); its Host/Port defaults then sit just above
  # Serval's defaults, so config/puma.rb's `port` wins over them, and the
  # file's `port N` listens on Rails's default host, as under Puma's handler.
  module HandlerSupport
    VALID_OPTIONS = {
      "Host=HOST" => "Hostname to listen on (default: localhost)",
      "Port=PORT" => "Port to listen on (default: 9292)",
      "Threads=MIN:MAX" => "min:max threads to use (default 0:5)",
      "Config=FILE" => "Serval config file (default config/serval.rb or config/puma.rb, - for none)",
      "Quiet" => "Do not print boot messages",
      "Verbose" => "Print debugging detail"
    }.freeze

    module_function

    def run(app, options, handler)
      config = config_for(options)
      log_writer = LogWriter.new(quiet: config[:quiet], verbose: config[:verbose])
      launcher = Launcher.new(config, log_writer: log_writer, app: app, restart_argv: restart_argv(options))
      handler.instance_variable_set(:@launcher, launcher)
      yield launcher if block_given?
      launcher.run
    ensure
      handler.instance_variable_set(:@launcher, nil)
    end

    def config_for(options, env = ENV)
      warn = ->(msg) { Kernel.warn(msg) }
      label = options.key?(:user_supplied_options) ? "rails server" : "rackup"
      cli = {}
      cli_sources = {}
      launcher = {}
      launcher_sources = {}
      apply(DSL.new(cli, warn, sources: cli_sources), options, label)
      binds(DSL.new(cli, warn, sources: cli_sources, source: "#{label} Host/Port option"),
            DSL.new(launcher, warn, sources: launcher_sources, source: "#{label} default Host/Port"), options)
      Configuration.load(cli: cli, cli_sources: cli_sources, config_file: options[:Config] || options[:config_file],
                         warn: warn, env: env, launcher: launcher, launcher_sources: launcher_sources,
                         default_host: host_for(options[:Host]))
    end

    def apply(dsl, options, label)
      given(dsl, "#{label} Threads option") { threads(dsl, options[:Threads]) } if options[:Threads]
      given(dsl, "#{label} environment") { dsl.environment(options[:environment]) } if options[:environment]
      given(dsl, "#{label} option") { dsl.quiet(true) } if options[:Silent] || options[:Quiet] || options[:quiet]
      given(dsl, "#{label} option") { dsl.verbose(true) } if options[:Verbose]
      given(dsl, "#{label} --early-hints") { dsl.early_hints(true) } if options[:early_hints]
    end

    def given(dsl, source)
      dsl.source = source
      yield
    end

    # Host/Port the user gave go on top; Rails's defaults go under the config
    # file and the environment (Puma's handler does the same with its layers).
    def binds(user, defaults, options)
      supplied = options[:user_supplied_options]
      port = options[:Port] || 9292
      if supplied.nil? ? options.key?(:Host) || options.key?(:Port) : supplied.intersect?(%i[Host Port])
        user.port(port, host_for(options[:Host]))
      elsif options[:Host] || options[:Port]
        defaults.port(port, host_for(options[:Host]))
      end
    end

    def host_for(host)
      host = host.to_s
      host.empty? ? nil : host.delete_prefix("[").delete_suffix("]")
    end

    def threads(dsl, value)
      min, max = value.to_s.split(":", 2)
      dsl.threads(min, max || min)
    end

    # Rails passes the command that starts it again (:restart_cmd, e.g.
    # "bin/rails server -u serval --restart"); a hot restart (USR2,
    # tmp/restart.txt) execs it with this Ruby. rackup passes none.
    def restart_argv(options)
      argv = Shellwords.split(options[:restart_cmd].to_s)
      return nil if argv.empty?

      File.file?(argv.first) ? [RbConfig.ruby, *argv] : argv
    end
  end
end
