# frozen_string_literal: true

require "fileutils"
require "securerandom"
require "yaml"
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
  class StateFile
    KEYS = %w[pid control_url control_auth_token running_from].freeze

    attr_reader :path

    def initialize(path)
      @path = File.expand_path(path)
    end

    # Atomic write (temp file + rename); nil values are left out. The temp
    # file has a random name and is created exclusively (O_EXCL, which also
    # refuses a symlink in its place) with mode 0600, so a file or symlink
    # planted beside the state file can neither read the token nor redirect
    # the write; rename replaces a symlink at the path itself, never its target.
    def write(values)
      data = values.to_h { |k, v| [k.to_s, v] }.compact
      FileUtils.mkdir_p(File.dirname(@path))
      tmp = "#{@path}.#{SecureRandom.hex(8)}.tmp"
      created = nil
      File.open(tmp, File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW, 0o600) do |f|
        created = tmp
        f.chmod(0o600) # whatever the umask
        f.write(YAML.dump(data))
      end
      File.rename(tmp, @path)
      created = nil
      @pid = Process.pid
    rescue SystemCallError => e
      raise ConfigError, "state_path: cannot write #{@path} (#{e.message})"
    ensure
      File.unlink(created) if created && File.exist?(created) # ours, left by a failed write
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
