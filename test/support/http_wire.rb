# frozen_string_literal: true

require "socket"
require "io/wait"

module Serval
  # A small HTTP/1.x client for wire-level tests: reads exactly one response
  # at a time from a socket (content-length, chunked or close-delimited), so
  # keep-alive connections and exact bytes can be checked. Every read has a
  # deadline and raises WireTimeout instead of hanging.
  module HttpWire
    class WireTimeout < StandardError; end

    Response = Struct.new(:status, :reason, :headers, :body, :head, :raw_body, keyword_init: true) do
      # All values of a header (names compared case-insensitively).
      def values(name)
        headers.select { |k, _| k.casecmp?(name) }.map(&:last)
      end

      def [](name)
        values(name).first
      end
    end

    class Client
      attr_reader :socket

      # port: an Integer (connects to 127.0.0.1) or an already open socket.
      def initialize(port, timeout: 5)
        @socket = port.is_a?(IO) ? port : TCPSocket.new("127.0.0.1", port)
        @buffer = +"".b
        @timeout = timeout
      end

      def write(bytes)
        @socket.write(bytes)
        self
      end

      def close
        @socket.close unless @socket.closed?
      end

      # Reads one response. head_request: the response to a HEAD has no body.
      def read_response(head_request: false)
        head = read_until("\r\n\r\n")
        status_line, *lines = head.split("\r\n")
        m = %r{\AHTTP/1\.[01] (\d{3}) ?(.*)\z}.match(status_line) or raise "bad status line #{status_line.inspect}"
        headers = lines.map { |l| l.split(": ", 2) }
        response = Response.new(status: m[1].to_i, reason: m[2], headers: headers, head: head)
        length = response["content-length"]
        if head_request || response.status < 200 || [204, 304].include?(response.status)
          response.body = response.raw_body = "".b
        elsif response["transfer-encoding"]&.casecmp?("chunked")
          read_chunked(response)
        elsif length
          response.body = response.raw_body = read_exact(Integer(length, 10))
        else
          response.body = response.raw_body = read_to_eof
        end
        response
      end

      def read_until(delimiter)
        until (i = @buffer.index(delimiter))
          fill
        end
        @buffer.slice!(0, i + delimiter.bytesize)
      end

      def read_exact(n)
        fill while @buffer.bytesize < n
        @buffer.slice!(0, n)
      end

      # Everything until the peer closes; raises WireTimeout if it does not.
      def read_to_eof
        loop { break unless fill(eof_ok: true) }
        @buffer.slice!(0, @buffer.bytesize)
      end

      # True once the peer has closed (EOF or reset) with nothing more to read.
      def closed_by_peer?
        fill(eof_ok: true) ? false : @buffer.empty?
      end

      def buffered
        @buffer
      end

      private

      def read_chunked(response)
        raw = +"".b
        body = +"".b
        loop do
          size_line = read_until("\r\n")
          raw << size_line
          size = Integer(size_line.chomp.split(";").first, 16)
          if size.zero?
            trailer = read_until("\r\n") # no trailers expected
            raw << trailer
            break
          end
          chunk = read_exact(size + 2)
          raw << chunk
          body << chunk.byteslice(0, size)
        end
        response.body = body
        response.raw_body = raw
      end

      # Reads more bytes into the buffer; false at EOF when eof_ok.
      def fill(eof_ok: false)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout
        loop do
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise WireTimeout, "no data within #{@timeout}s (buffered #{@buffer.bytesize} bytes)" if left <= 0

          @socket.wait_readable(left)
          chunk = begin
            @socket.read_nonblock(65_536, exception: false)
          rescue Errno::ECONNRESET
            nil
          end
          next if chunk == :wait_readable
          if chunk.nil?
            return false if eof_ok

            raise EOFError, "connection closed (buffered #{@buffer.bytesize} bytes: #{@buffer[0, 200].inspect})"
          end
          @buffer << chunk
          return true
        end
      end
    end

    def connect(port, timeout: 5)
      client = Client.new(port, timeout: timeout)
      (@wire_clients ||= []) << client
      client
    end

    # One request on a fresh connection; returns the parsed response.
    def http(port, request, head_request: false, timeout: 5)
      client = connect(port, timeout: timeout)
      client.write(request)
      client.read_response(head_request: head_request)
    ensure
      client&.close
    end

    def get(path, headers = {}, version: "1.1")
      lines = ["GET #{path} HTTP/#{version}"]
      lines << "Host: localhost" if version == "1.1" && !headers.key?("Host")
      headers.each { |k, v| lines << "#{k}: #{v}" }
      "#{lines.join("\r\n")}\r\n\r\n"
    end

    def teardown
      (@wire_clients || []).each(&:close)
      super
    end
  end
end
