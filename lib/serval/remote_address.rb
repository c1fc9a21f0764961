# frozen_string_literal: true

require "serval/errors"
require "serval/native_ext"

module Serval
  # Puma's set_remote_address: where a request's REMOTE_ADDR comes from
  # (docs/configuration.md "REMOTE_ADDR"). The configuration key
  # remote_address holds one of
  #
  #   :socket                     the connection's peer (the default)
  #   { value: "127.0.0.1" }      this text for every request (:localhost, "ADDR")
  #   { header: "X-Real-IP" }     the first element of that request header, else the peer
  #   { proxy_protocol: :v1 }     each connection starts with a PROXY header (:v1, :v2, :any)
  #
  # The native core does the work (ext/serval/loop.c, env.c, parser.c); the
  # bounds are its own (Native::Core::REMOTE_LIMITS).
  module RemoteAddress
    LIMITS = Native::Core::REMOTE_LIMITS
    PROXY_VERSIONS = %i[v1 v2 any].freeze
    USAGE = ":socket, :localhost, an address String, header: \"X-Forwarded-For\" or proxy_protocol: :v1 / :v2 / :any"

    module_function

    # Any accepted spelling (Puma's, or the normalised value) -> the normalised value.
    def coerce(name, value)
      case value
      when :socket, "socket" then :socket
      when :localhost then { value: "127.0.0.1" }.freeze
      when String then { value: address(name, value) }.freeze
      when Hash then from_hash(name, value)
      else raise ConfigError, "#{name}: expected #{USAGE}, got #{value.inspect}"
      end
    end

    def from_hash(name, hash)
      hash = hash.transform_keys { |k| k.is_a?(String) ? k.to_sym : k }
      unless hash.size == 1 && %i[value header proxy_protocol].include?(hash.keys.first)
        raise ConfigError, "#{name}: expected one of header:, proxy_protocol: (or :socket, :localhost, an address), " \
                           "got #{hash.inspect}"
      end

      key, val = hash.first
      val = case key
            when :value then address(name, val)
            when :header then header(name, val)
            else proxy_version(name, val)
            end
      { key => val }.freeze
    end

    # A literal REMOTE_ADDR: printable ASCII without spaces, as the env gets it.
    def address(name, value)
      unless value.is_a?(String) && value.match?(/\A[\x21-\x7e]+\z/) && value.bytesize <= LIMITS[:value]
        raise ConfigError, "#{name}: an address must be 1..#{LIMITS[:value]} printable characters without spaces, " \
                           "got #{value.inspect}"
      end

      value.dup.freeze
    end

    # The field's name as the proxy sends it ("X-Forwarded-For"), not its env key.
    def header(name, value)
      value = value.to_s if value.is_a?(Symbol)
      unless value.is_a?(String) && value.match?(/\A[A-Za-z0-9!#$%&'*+.^`|~-]+\z/) && value.bytesize <= LIMITS[:header]
        raise ConfigError, "#{name}: header: expected a header field name like \"X-Forwarded-For\" (letters, digits, " \
                           "'-'; no '_', which Serval drops from requests), got #{value.inspect}"
      end
      value.dup.freeze
    end

    def proxy_version(name, value)
      version = value.to_s.downcase.to_sym if value.is_a?(String) || value.is_a?(Symbol)
      return version if PROXY_VERSIONS.include?(version)

      raise ConfigError, "#{name}: proxy_protocol: expected :v1, :v2 or :any (either, told apart by the first byte), " \
                        "got #{value.inspect}"
    end

    # The PROXY header comes before TLS; the core reads it on plain listeners only.
    def check(opts)
      remote = opts[:remote_address]
      return unless remote.is_a?(Hash) && remote[:proxy_protocol]

      tls = Array(opts[:binds]).select { |b| b.to_s.start_with?("ssl://") }
      return if tls.empty?

      raise ConfigError, "set_remote_address proxy_protocol: is not supported on ssl:// binds (#{tls.join(', ')}); " \
                         "terminate TLS in the proxy, or bind tcp:// / unix:// for it"
    end

    # Server#core_options: the Native::Core.new keys for the value.
    def core_options(remote)
      return {} unless remote.is_a?(Hash)

      if remote[:proxy_protocol] then { proxy_protocol: remote[:proxy_protocol] }
      elsif remote[:header] then { remote_header: remote[:header] }
      else { remote_value: remote[:value] }
      end
    end
  end
end
