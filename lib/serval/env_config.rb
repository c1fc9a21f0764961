# frozen_string_literal: true

require "serval/errors"

module Serval
  # The environment-variable layer of the configuration: above the defaults,
  # below the config file and the command line (docs/configuration.md).
  #
  #   EnvConfig.read("WEB_CONCURRENCY" => "2", "RAILS_MAX_THREADS" => "3")
  #   # => [{ workers: 2, max_threads: 3 }, { workers: "env WEB_CONCURRENCY", max_threads: "env RAILS_MAX_THREADS" }]
  #
  # A variable that is unset or blank is skipped; a bad value raises
  # ConfigError naming the variable.
  module EnvConfig
    # option key => variables, the first one set wins. RAILS_* are what Rails
    # apps set (database.yml sizes its pool with RAILS_MAX_THREADS); PUMA_* and
    # the bare names are the ones Puma itself reads.
    VARIABLES = {
      workers: %w[WEB_CONCURRENCY],
      max_threads: %w[RAILS_MAX_THREADS PUMA_MAX_THREADS MAX_THREADS],
      min_threads: %w[RAILS_MIN_THREADS PUMA_MIN_THREADS MIN_THREADS],
      environment: %w[APP_ENV RACK_ENV RAILS_ENV]
    }.freeze

    module_function

    # Returns [options, sources].
    def read(env = ENV)
      require "serval/configuration"
      options = {}
      sources = {}
      VARIABLES.each do |key, names|
        name = names.find { |n| !env[n].to_s.strip.empty? }
        next unless name

        if key == :max_threads && env[name].strip == "auto" # threads :auto (docs/tuning.md)
          options[:threads_auto] = true
          sources[:threads_auto] = "env #{name}"
          next
        end
        options[key] = coerce(key, name, env[name].strip)
        sources[key] = "env #{name}"
      end
      [options, sources]
    end

    # Before a config file runs: RAILS_MAX_THREADS (or PUMA_/MAX_THREADS)
    # "auto" becomes the most threads auto may run (threads_auto_max from the
    # command line, else the default; the launcher sets it again from the
    # final options), and WEB_CONCURRENCY "auto" the processor count, so that
    # an app loaded by the file (database.yml's pool) never reads "auto".
    # Returns the threads value written (nil: none), which the file's
    # `threads` reads as auto.
    def export_auto(env, cli, env_options)
      if env["WEB_CONCURRENCY"].to_s.strip == "auto"
        require "etc"
        env["WEB_CONCURRENCY"] = Etc.nprocessors.to_s
      end
      return nil unless env_options[:threads_auto]

      value = (cli[:threads_auto_max] || Configuration::DEFAULTS[:threads_auto_max]).to_s
      VARIABLES[:max_threads].each do |name|
        next unless env[name].to_s.strip == "auto"

        env[name] = value
        exported[name] = value
      end
      value
    end

    # name => the value export_auto wrote (Launcher::Support.export_auto_threads
    # replaces it with the final threads_auto_max).
    def exported
      @exported ||= {}
    end

    def coerce(key, name, raw)
      Configuration.coerce(key, raw, name: name)
    rescue ConfigError => e
      raise unless e.message.include?(":auto")

      raise ConfigError, "#{name}: expected a number of workers or auto, got #{raw.inspect}"
    end
  end
end
