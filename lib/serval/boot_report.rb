# frozen_string_literal: true

require "serval/configuration"

module Serval
  # The boot lines that say what the key settings are and where each came
  # from (options[:sources]: flag, config file, environment variable, default).
  #
  #   * Environment: production (env RAILS_ENV)
  #   * Threads: 3..3 (config file config/puma.rb)
  #   * Workers: 2 (env WEB_CONCURRENCY), preload: true
  #   * Binds: tcp://localhost:3000 (rails server default Host/Port)
  module BootReport
    module_function

    # preload: cluster mode's effective preload (nil in single mode).
    def lines(options, preload: nil)
      workers = "* Workers: #{options[:workers]} (#{source(options, :workers)})"
      workers += ", preload: #{preload}" unless preload.nil?
      out = ["* Environment: #{options[:environment]} (#{source(options, :environment)})",
             threads_line(options),
             workers,
             "* Binds: #{options[:binds].join(', ')} (#{source(options, :binds)})"]
      plugins = options.fetch(:plugins, [])
      out << "* Plugins: #{plugins.join(', ')} (#{source(options, :plugins)})" unless plugins.empty?
      puma = options.fetch(:puma_plugins, []).map(&:first)
      out << "* Puma plugins: #{puma.join(', ')} (#{source(options, :puma_plugins)})" unless puma.empty?
      out
    end

    def threads_line(options)
      unless options[:threads_auto]
        return "* Threads: #{options[:min_threads]}..#{options[:max_threads]} (#{threads_source(options)})"
      end

      "* Threads: auto, starting at #{options[:max_threads]}, within #{Configuration.auto_floor(options)}.." \
        "#{options[:threads_auto_max]} (#{source(options, :threads_auto)})"
    end

    def threads_source(options)
      min = source(options, :min_threads)
      max = source(options, :max_threads)
      min == max ? min : "min from #{min}, max from #{max}"
    end

    def source(options, key)
      Configuration.source(options, key)
    end
  end
end
