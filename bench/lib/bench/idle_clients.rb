# frozen_string_literal: true

require "socket"

module Bench
  # Opens N keep-alive connections to a server, sends one GET on each, reads
  # its whole response and keeps the connection open (idle), for measuring
  # what an idle keep-alive connection costs the server. Connections are
  # opened in batches (connect the batch, write its requests, read its
  # responses) so that the listen backlog never overflows. Closing resets
  # the connections (SO_LINGER 0): no TIME_WAIT is left to use up ports.
  class IdleClients
    REQUEST = "GET %<path>s HTTP/1.1\r\nHost: %<host>s:%<port>d\r\n\r\n"

    attr_reader :sockets, :failures

    def initialize(host, port, path: "/", batch: 256, timeout: 10)
      @host = host
      @port = port
      @request = format(REQUEST, path: path, host: host, port: port)
      @batch = batch
      @timeout = timeout
      @sockets = []
      @failures = Hash.new(0)
    end

    # Open n more connections; returns how many are open and answered 200.
    # Stops early (recording why in failures) once a whole batch fails.
    def open(n)
      deadline = Util.now + @timeout + (n / 1000.0)
      while n.positive?
        take = [n, @batch].min
        ok = open_batch(take, deadline)
        n -= take
        break if ok.zero?
      end
      @sockets.size
    end

    # How many of the connections the server still holds open: a socket that
    # reads EOF or an error was closed by the server.
    def still_open
      @sockets.count do |sock|
        sock.read_nonblock(1, exception: false) == :wait_readable
      rescue SystemCallError, IOError
        false
      end
    end

    def close
      linger = [1, 0].pack("ii")
      @sockets.each do |sock|
        sock.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, linger)
        sock.close
      rescue SystemCallError, IOError
        nil
      end
      @sockets.clear
    end

    private

    def open_batch(take, deadline)
      batch = []
      take.times do
        batch << Socket.tcp(@host, @port, connect_timeout: [deadline - Util.now, 0.1].max)
      rescue SystemCallError, SocketError => e
        @failures["connect: #{e.class.name.split('::').last}"] += 1
      end
      batch.select! do |sock|
        next true if sent?(sock, deadline)

        sock.close
        false
      end
      batch.count do |sock|
        if answered?(sock, deadline)
          @sockets << sock
          true
        else
          sock.close
          false
        end
      end
    end

    def sent?(sock, deadline)
      HTTP.write_all(sock, @request.dup, deadline)
      true
    rescue HTTP::Timeout, SystemCallError, IOError => e
      @failures["write: #{e.class.name.split('::').last}"] += 1
      false
    end

    def answered?(sock, deadline)
      raw = HTTP.read_response(sock, deadline)
      status, = HTTP.parse(raw)
      return true if status == 200

      @failures["status #{status}"] += 1
      false
    rescue HTTP::Timeout, SystemCallError, IOError => e
      @failures["response: #{e.class.name.split('::').last}"] += 1
      false
    end
  end
end
