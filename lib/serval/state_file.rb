# frozen_string_literal: true

require "yaml"
require "serval/atomic_file"
require "serval/errors"

module Serval
  # The state file (Puma's state_path): a small YAML document the launcher
  # writes at boot so tools (servalctl) can find the server.
  #
  #   ---
  #   pid: 4242
  #   control_url: unix:///run/app/control.sock
  #   control_auth_token: 5f0c...
  #   running_from: /srv/app
  #
  # It holds the control token, so it is written with mode 0600.
  #
  # Without state_path, a server with a control app writes DEFAULT under the
  # app's directory when its tmp/ exists (StateFile.with_default); servalctl
  # looks there before any config file (docs/control.md "State file").
  class StateFile
    KEYS = %w[pid control_url control_auth_token running_from].freeze
    DEFAULT = "tmp/serval.state"

    # The options with state_path set to the default when it applies: no
    # state_path given, a control app (the file exists to find it), and the
    # app directory's tmp/ a directory this process may write (none is
    # created: a Rails app has one; elsewhere nothing is left behind).
    def self.with_default(options)
      return options if options[:state_path] || !options[:control_url]

      tmp = File.expand_path("tmp", options[:directory] || Dir.pwd)
      return options unless File.directory?(tmp) && File.writable?(tmp)

      sources = (options[:sources] || {}).merge(state_path: "default (#{DEFAULT})").freeze
      options.merge(state_path: File.join(tmp, File.basename(DEFAULT)).freeze, sources: sources).freeze
    end

    attr_reader :path

    def initialize(path)
      @path = File.expand_path(path)
    end

    # Atomic and exclusive (Serval::AtomicFile), mode 0600; nil values are
    # left out.
    def write(values)
      data = values.to_h { |k, v| [k.to_s, v] }.compact
      AtomicFile.write(@path, YAML.dump(data), 0o600)
      @pid = Process.pid
    rescue SystemCallError => e
      raise ConfigError, "state_path: cannot write #{@path} (#{e.message})"
    end

    # Hash with string keys; raises ConfigError when missing or malformed.
    def read
      data = YAML.safe_load(File.read(@path))
      raise ConfigError, "state file #{@path}: expected a mapping" unless data.is_a?(Hash)

      data.slice(*KEYS)
    rescue SystemCallError => e
      raise ConfigError, "state file #{@path}: #{e.message}"
    rescue Psych::Exception => e
      raise ConfigError, "state file #{@path}: #{e.message}"
    end

    # Removes the file if this process wrote it and it still names us.
    def remove
      return unless @pid == Process.pid && File.file?(@path)

      File.unlink(@path) if read["pid"] == Process.pid
    rescue ConfigError, SystemCallError
      nil
    end
  end
end
