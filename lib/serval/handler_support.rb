# frozen_string_literal: true

require "serval/configuration"
require "serval/dsl"
require "serval/log_writer"
require "serval/launcher"

module Serval
  # The body of the Rack/Rackup handlers (`rackup -s serval`, `rails server
  # serval`): turns handler options into Serval options and runs a Launcher.
  # The default config file (config/serval.rb) is read as the middle layer;
  # handler options win over it, except Host/Port when Rails says the user
  # did not give them (:user_supplied_options), as Puma's handler does.
  module HandlerSupport
    VALID_OPTIONS = {
      "Host=HOST" => "Hostname to listen on (default: localhost)",
      "Port=PORT" => "Port to listen on (default: 9292)",
      "Threads=MIN:MAX" => "min:max threads to use (default 0:5)",
      "Config=FILE" => "Serval config file (default config/serval.rb, - for none)",
      "Quiet" => "Do not print boot messages",
      "Verbose" => "Print debugging detail"
    }.freeze

    module_function

    def run(app, options, handler)
      config = config_for(options)
      log_writer = LogWriter.new(quiet: config[:quiet], verbose: config[:verbose])
      launcher = Launcher.new(config, log_writer: log_writer, app: app)
      handler.instance_variable_set(:@launcher, launcher)
      yield launcher if block_given?
      launcher.run
    ensure
      handler.instance_variable_set(:@launcher, nil)
    end

    def config_for(options)
      warn = ->(msg) { Kernel.warn(msg) }
      cli = {}
      dsl = DSL.new(cli, warn)
      apply(dsl, options)
      config_file = options[:Config] || options[:config_file]
      Configuration.load(cli: cli, config_file: config_file, warn: warn)
    end

    def apply(dsl, options)
      supplied = options[:user_supplied_options]
      if bind_given?(options, supplied)
        dsl.port(options[:Port] || 9292, host_for(options[:Host]))
      end
      threads(dsl, options[:Threads]) if options[:Threads]
      dsl.environment(options[:environment]) if options[:environment]
      dsl.quiet(true) if options[:Silent] || options[:Quiet] || options[:quiet]
      dsl.verbose(true) if options[:Verbose]
    end

    def bind_given?(options, supplied)
      return options.key?(:Host) || options.key?(:Port) unless supplied

      supplied.include?(:Host) || supplied.include?(:Port)
    end

    def host_for(host)
      host = host.to_s
      host.empty? ? nil : host.delete_prefix("[").delete_suffix("]")
    end

    def threads(dsl, value)
      min, max = value.to_s.split(":", 2)
      dsl.threads(min, max || min)
    end
  end
end
