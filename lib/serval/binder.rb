# frozen_string_literal: true

require "socket"
require "uri"
require "serval/errors"
require "serval/systemd"

module Serval
  # Turns bind URIs into listening sockets.
  #
  #   tcp://0.0.0.0:9292   tcp://[::1]:0?backlog=64   unix:///tmp/s.sock?mode=0660&umask=0077
  #   ssl://0.0.0.0:9443?cert=/path/cert.pem&key=/path/key.pem[&ca=PATH&verify_mode=none|peer]
  #
  # Ruby creates every descriptor close-on-exec; TCPServer sets SO_REUSEADDR
  # (we set it again to be explicit). The Ruby IO objects stay open here: the
  # native core only borrows their descriptors.
  #
  # Inherited sockets come first: systemd's (LISTEN_PID/LISTEN_FDS, see
  # Serval::Systemd) and a hot restart's (SERVAL_INHERITED_FDS="fd=url,fd=url",
  # written by #inherit_env). Each bind adopts an inherited socket with the same
  # URL or address instead of binding again; unmatched systemd sockets serve as
  # extra listeners, unmatched hot-restart sockets are closed.
  class Binder
    Bind = Struct.new(:uri, :scheme, :host, :port, :path, :backlog, :mode, :umask, :tls, keyword_init: true)
    # tls: a Native::TLSContext for ssl:// binds; inherited: nil, :systemd or :restart
    Listener = Struct.new(:io, :url, :bind, :unix_path, :tls, :inherited, keyword_init: true)
    INHERIT_ENV = "SERVAL_INHERITED_FDS"
    TLS_PARAMS = %w[cert key ca verify_mode].freeze

    # Query parameters Puma users may carry that change nothing here.
    IGNORED_PARAMS = %w[low_latency].freeze

    # Parses and checks one bind URI without touching the network.
    def self.parse(uri)
      case uri
      when %r{\Atcp://} then parse_tcp(uri)
      when %r{\Aunix://} then parse_unix(uri)
      when %r{\Assl://} then parse_ssl(uri)
      else raise ConfigError, "bind #{uri}: expected tcp://HOST:PORT, ssl://HOST:PORT or unix://PATH"
      end
    end

    def self.parse_tcp(uri, extra = [])
      parsed = URI.parse(uri.sub(/\Assl:/, "tcp:"))
      host = parsed.hostname
      raise ConfigError, "bind #{uri}: missing host" if host.nil? || host.empty?
      raise ConfigError, "bind #{uri}: missing port" if parsed.port.nil?
      raise ConfigError, "bind #{uri}: port must be 0..65535" unless (0..65_535).cover?(parsed.port)
      raise ConfigError, "bind #{uri}: unexpected path #{parsed.path}" unless ["", "/"].include?(parsed.path)

      params = query(uri, parsed.query, %w[backlog] + extra)
      Bind.new(uri: uri, scheme: :tcp, host: host, port: parsed.port, backlog: backlog(uri, params)).tap do |bind|
        bind.tls = params.slice(*extra) unless extra.empty?
      end
    rescue URI::Error
      raise ConfigError, "bind #{uri}: not a valid URI"
    end

    # ssl://HOST:PORT?cert=PATH&key=PATH: a TCP bind whose bind.tls holds the
    # TLS parameters (checked here; the files are loaded when binding).
    def self.parse_ssl(uri)
      bind = parse_tcp(uri, TLS_PARAMS)
      bind.scheme = :ssl
      tls = bind.tls
      %w[cert key].each do |key|
        raise ConfigError, "bind #{uri}: missing #{key}=PATH" if tls[key].nil? || tls[key].empty?
      end
      mode = tls["verify_mode"] ||= "none"
      raise ConfigError, "bind #{uri}: verify_mode must be none or peer (got #{mode})" unless %w[none peer].include?(mode)
      raise ConfigError, "bind #{uri}: verify_mode=peer needs ca=PATH" if mode == "peer" && tls["ca"].to_s.empty?

      bind
    end

    def self.parse_unix(uri)
      path, query_string = uri.delete_prefix("unix://").split("?", 2)
      raise ConfigError, "bind #{uri}: missing socket path" if path.nil? || path.empty?
      raise ConfigError, "bind #{uri}: abstract sockets are not supported" if path.start_with?("@")

      params = query(uri, query_string, %w[backlog mode umask])
      Bind.new(uri: uri, scheme: :unix, path: path, backlog: backlog(uri, params),
               mode: octal(uri, params, "mode"), umask: octal(uri, params, "umask"))
    end

    def self.octal(uri, params, key)
      value = params[key]
      return nil if value.nil?
      raise ConfigError, "bind #{uri}: #{key} must be octal like 0660" unless value.match?(/\A0?[0-7]{3}\z/)

      Integer(value, 8)
    end

    def self.query(uri, string, allowed)
      return {} if string.nil? || string.empty?

      URI.decode_www_form(string).to_h.tap do |params|
        unknown = params.keys.reject { |key| allowed.include?(key) || IGNORED_PARAMS.include?(key) }
        next if unknown.empty?

        names = unknown.map { |key| "`#{key}`" }.join(", ")
        raise ConfigError, "bind #{uri}: unknown parameter#{'s' if unknown.size > 1} #{names}"
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

    def self.url_for(io, scheme = "http")
      addr = io.local_address
      return "unix://#{addr.unix_path}" if addr.unix?

      host = addr.ipv6? ? "[#{addr.ip_address}]" : addr.ip_address
      "#{scheme}://#{host}:#{addr.ip_port}"
    end

    attr_reader :listeners

    # log_writer: where adopted and unmatched inherited sockets are reported.
    def initialize(backlog: 1024, log_writer: nil, env: ENV)
      @backlog = backlog
      @log_writer = log_writer
      @env = env
      @listeners = []
    end

    # Binds every URI; on any error closes what was opened and raises ConfigError.
    # activated_only (Puma's `bind_to_activated_sockets 'only'`): when
    # sockets were passed in (systemd, or a hot restart's), a bind that none
    # of them matches is not bound.
    def bind(uris, activated_only: false)
      inherited = take_inherited
      only = activated_only && !inherited.empty?
      uris.each do |uri|
        bind = self.class.parse(uri)
        tls = tls_context(bind) if bind.scheme == :ssl
        adopted = adopt(inherited, bind, tls)
        if adopted.empty? && only
          log(:info, "* Not binding #{uri}: bind_to_activated_sockets 'only' and sockets were passed in")
          next
        end
        @listeners.concat(adopted.empty? ? listen(bind, tls) : adopted)
      end
      finish_inherited(inherited)
      @listeners
    rescue StandardError
      inherited&.each { |s| s[:io].close unless s[:io].closed? }
      close
      raise
    end

    def ios
      @listeners.map(&:io)
    end

    def urls
      @listeners.map(&:url)
    end

    # For a hot restart (re-exec keeping the sockets): the environment entry
    # and the spawn/exec redirections that pass every listener to the new
    # process, which adopts them by URL in #bind.
    def inherit_env
      list = @listeners.map { |l| "#{l.io.fileno}=#{(l.bind&.uri || l.url).gsub(',', '%2C')}" }
      { INHERIT_ENV => list.join(",") }
    end

    def inherit_redirects
      @listeners.to_h { |l| [l.io.fileno, l.io.fileno] }
    end

    # Closes every listener and removes the unix socket files we created
    # (unlink: false when a new process keeps serving on them).
    def close(unlink: true)
      @listeners.each do |listener|
        listener.io.close unless listener.io.closed?
        File.unlink(listener.unix_path) if unlink && listener.unix_path && File.socket?(listener.unix_path)
      rescue SystemCallError, IOError
        nil
      end
      @listeners = []
    end

    private

    def listen(bind, tls)
      return listen_unix(bind) if bind.scheme == :unix

      listen_tcp(bind).each do |listener|
        next unless tls

        listener.tls = tls
        listener.url = self.class.url_for(listener.io, "ssl")
      end
    end

    def tls_context(bind)
      require "serval/native_ext"
      unless defined?(Native::TLSContext)
        raise ConfigError, "bind #{bind.uri}: TLS is unavailable (serval was built without OpenSSL; install libssl-dev and reinstall)"
      end

      t = bind.tls
      Native::TLSContext.new(t["cert"], t["key"], t["ca"], t["verify_mode"] == "peer")
    rescue ArgumentError, SystemCallError => e
      raise ConfigError, "bind #{bind.uri}: #{e.message}"
    end

    # ---- inherited sockets ------------------------------------------------

    # [{io:, fd:, url: (hot restart only), source: :systemd | :restart}]
    def take_inherited
      list = Systemd.listen_fds(@env).filter_map { |fd| inherited_socket(fd, nil, :systemd) }
      spec = @env.delete(INHERIT_ENV)
      spec.to_s.split(",").each do |entry|
        fd, url = entry.split("=", 2)
        next unless fd&.match?(/\A\d+\z/) && url

        socket = inherited_socket(Integer(fd, 10), url.gsub("%2C", ","), :restart)
        list << socket if socket
      end
      list
    end

    def inherited_socket(fd, url, source)
      io = Socket.for_fd(fd)
      io.autoclose = true
      io.close_on_exec = true
      io.local_address # raises when fd is not a bound socket
      { io: io, fd: fd, url: url, source: source }
    rescue SystemCallError, ArgumentError, SocketError => e
      log(:error, "serval: inherited fd #{fd} (#{source}) is not a listening socket: #{e.message}; ignored")
      io&.close rescue nil
      nil
    end

    def adopt(inherited, bind, tls)
      matched = inherited.select { |s| s[:url] == bind.uri }
      matched = inherited.select { |s| s[:url].nil? && same_address?(s[:io].local_address, bind) } if matched.empty?
      matched.map do |s|
        inherited.delete(s)
        log(:info, "* Adopted #{s[:source]} fd #{s[:fd]} for #{bind.uri}")
        listener_for(s, bind, tls)
      end
    end

    def listener_for(socket, bind, tls)
      io = socket[:io]
      url = self.class.url_for(io, tls ? "ssl" : "http")
      unix_path = socket[:source] == :restart && io.local_address.unix? ? io.local_address.unix_path : nil
      Listener.new(io: io, url: url, bind: bind, unix_path: unix_path, tls: tls, inherited: socket[:source])
    end

    def same_address?(addr, bind)
      if bind.scheme == :unix
        addr.unix? && File.expand_path(addr.unix_path) == File.expand_path(bind.path)
      else
        addr.ip? && addr.ip_port == bind.port && bind.port != 0 && addresses(bind.host).include?(addr.ip_address)
      end
    end

    def addresses(host)
      Addrinfo.getaddrinfo(host, nil, nil, :STREAM).map(&:ip_address)
    rescue SocketError
      []
    end

    # Unmatched systemd sockets serve too (plain HTTP); unmatched hot-restart
    # sockets belong to binds that were removed from the configuration.
    def finish_inherited(inherited)
      inherited.each do |s|
        if s[:source] == :systemd
          listener = listener_for(s, nil, nil)
          log(:info, "* Using systemd socket fd #{s[:fd]} (#{listener.url}), not named by any bind")
          @listeners << listener
        else
          log(:info, "* Closing inherited fd #{s[:fd]} (#{s[:url]}): no longer bound")
          s[:io].close
        end
      end
    end

    def log(level, message)
      @log_writer&.public_send(level, message)
    end

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
      io = with_umask(bind.umask) { UNIXServer.new(path) }
      io.listen(bind.backlog || @backlog)
      File.chmod(bind.mode, path) if bind.mode
      [Listener.new(io: io, url: "unix://#{path}", bind: bind, unix_path: path)]
    rescue SystemCallError => e
      io&.close
      raise ConfigError, "bind #{bind.uri}: #{error_text(e)}"
    end

    def with_umask(mask)
      return yield if mask.nil?

      old = File.umask(mask)
      begin
        yield
      ensure
        File.umask(old)
      end
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
