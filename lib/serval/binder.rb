# frozen_string_literal: true

require "socket"
require "uri"
require "serval/errors"

module Serval
  # Turns bind URIs into listening sockets.
  #
  #   tcp://0.0.0.0:9292   tcp://[::1]:0?backlog=64   unix:///tmp/s.sock?mode=0660
  #
  # Ruby creates every descriptor close-on-exec; TCPServer sets SO_REUSEADDR
  # (we set it again to be explicit). The Ruby IO objects stay open here: the
  # native core only borrows their descriptors.
  class Binder
    Bind = Struct.new(:uri, :scheme, :host, :port, :path, :backlog, :mode, keyword_init: true)
    Listener = Struct.new(:io, :url, :bind, :unix_path, keyword_init: true)

    # Query parameters Puma users may carry that change nothing here.
    IGNORED_PARAMS = %w[low_latency].freeze

    # Parses and checks one bind URI without touching the network.
    def self.parse(uri)
      case uri
      when %r{\Atcp://} then parse_tcp(uri)
      when %r{\Aunix://} then parse_unix(uri)
      when %r{\Assl://} then raise ConfigError, "bind #{uri}: ssl binds are not supported yet"
      else raise ConfigError, "bind #{uri}: expected tcp://HOST:PORT or unix://PATH"
      end
    end

    def self.parse_tcp(uri)
      parsed = URI.parse(uri)
      host = parsed.hostname
      raise ConfigError, "bind #{uri}: missing host" if host.nil? || host.empty?
      raise ConfigError, "bind #{uri}: missing port" if parsed.port.nil?
      raise ConfigError, "bind #{uri}: port must be 0..65535" unless (0..65_535).cover?(parsed.port)
      raise ConfigError, "bind #{uri}: unexpected path #{parsed.path}" unless ["", "/"].include?(parsed.path)

      params = query(uri, parsed.query, %w[backlog])
      Bind.new(uri: uri, scheme: :tcp, host: host, port: parsed.port, backlog: backlog(uri, params))
    rescue URI::Error
      raise ConfigError, "bind #{uri}: not a valid URI"
    end

    def self.parse_unix(uri)
      path, query_string = uri.delete_prefix("unix://").split("?", 2)
      raise ConfigError, "bind #{uri}: missing socket path" if path.nil? || path.empty?
      raise ConfigError, "bind #{uri}: abstract sockets are not supported" if path.start_with?("@")

      params = query(uri, query_string, %w[backlog mode])
      mode = params["mode"]
      if mode
        raise ConfigError, "bind #{uri}: mode must be octal like 0660" unless mode.match?(/\A0?[0-7]{3}\z/)

        mode = Integer(mode, 8)
      end
      Bind.new(uri: uri, scheme: :unix, path: path, backlog: backlog(uri, params), mode: mode)
    end

    def self.query(uri, string, allowed)
      return {} if string.nil? || string.empty?

      URI.decode_www_form(string).to_h.tap do |params|
        params.each_key do |key|
          next if allowed.include?(key) || IGNORED_PARAMS.include?(key)

          raise ConfigError, "bind #{uri}: unknown parameter `#{key}`"
        end
      end
    rescue ArgumentError
      raise ConfigError, "bind #{uri}: bad query string"
    end

    def self.backlog(uri, params)
      value = params["backlog"]
      return nil if value.nil?
      raise ConfigError, "bind #{uri}: backlog must be an integer" unless value.match?(/\A\d+\z/)

      Integer(value, 10).tap do |n|
        raise ConfigError, "bind #{uri}: backlog must be 1..65535" unless (1..65_535).cover?(n)
      end
    end

    def self.url_for(io)
      addr = io.local_address
      return "unix://#{addr.unix_path}" if addr.unix?

      host = addr.ipv6? ? "[#{addr.ip_address}]" : addr.ip_address
      "http://#{host}:#{addr.ip_port}"
    end

    attr_reader :listeners

    def initialize(backlog: 1024)
      @backlog = backlog
      @listeners = []
    end

    # Binds every URI; on any error closes what was opened and raises ConfigError.
    def bind(uris)
      uris.each do |uri|
        bind = self.class.parse(uri)
        @listeners.concat(bind.scheme == :unix ? listen_unix(bind) : listen_tcp(bind))
      end
      @listeners
    rescue StandardError
      close
      raise
    end

    def ios
      @listeners.map(&:io)
    end

    def urls
      @listeners.map(&:url)
    end

    # Closes every listener and removes the unix socket files we created.
    def close
      @listeners.each do |listener|
        listener.io.close unless listener.io.closed?
        File.unlink(listener.unix_path) if listener.unix_path && File.socket?(listener.unix_path)
      rescue SystemCallError, IOError
        nil
      end
      @listeners = []
    end

    private

    def listen_tcp(bind)
      hosts = bind.host == "localhost" ? ["127.0.0.1", "::1"] : [bind.host]
      port = bind.port
      hosts.each_with_index.filter_map do |host, index|
        io = open_tcp(bind, host, port, optional: index.positive?)
        next unless io

        port = io.local_address.ip_port
        Listener.new(io: io, url: self.class.url_for(io), bind: bind)
      end
    end

    def open_tcp(bind, host, port, optional:)
      io = TCPServer.new(host, port)
      io.setsockopt(Socket::SOL_SOCKET, Socket::SO_REUSEADDR, true)
      io.listen(bind.backlog || @backlog)
      io
    rescue Errno::EADDRNOTAVAIL, Errno::EAFNOSUPPORT => e
      return nil if optional

      raise ConfigError, "bind #{bind.uri}: #{error_text(e)}"
    rescue SystemCallError, SocketError => e
      raise ConfigError, "bind #{bind.uri}: #{error_text(e)}"
    end

    def listen_unix(bind)
      path = bind.path
      remove_stale(bind, path)
      io = UNIXServer.new(path)
      io.listen(bind.backlog || @backlog)
      File.chmod(bind.mode, path) if bind.mode
      [Listener.new(io: io, url: "unix://#{path}", bind: bind, unix_path: path)]
    rescue SystemCallError => e
      io&.close
      raise ConfigError, "bind #{bind.uri}: #{error_text(e)}"
    end

    # A socket file left by a dead server is removed; a live one is an error.
    def remove_stale(bind, path)
      return unless File.exist?(path)
      raise ConfigError, "bind #{bind.uri}: #{path} exists and is not a socket" unless File.socket?(path)

      begin
        UNIXSocket.new(path).close
      rescue Errno::ECONNREFUSED, Errno::ENOENT
        File.unlink(path) if File.socket?(path)
        return
      end
      raise ConfigError, "bind #{bind.uri}: address already in use (a server is listening on #{path})"
    end

    def error_text(error)
      case error
      when Errno::EADDRINUSE then "address already in use"
      when Errno::EACCES then "permission denied"
      when SocketError then "cannot resolve host (#{error.message})"
      else error.message
      end
    end
  end
end
