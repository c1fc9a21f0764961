# frozen_string_literal: true

require "socket"
require "io/wait"
require "digest"

module Serval
  module TestHelpers
    # Raw-socket HTTP/1.1 client and assertions shared by test/http_*_test.rb.
    module RawHTTP
      IO_TIMEOUT = 5.0

      Response = Struct.new(:status_line, :headers, :body, :raw) do
        def status
          status_line[/\AHTTP\/1\.[01] (\d{3})/, 1].to_i
        end

        # Header lookup by lowercase name; all values joined with ", ".
        def [](name)
          values = headers.select { |k, _| k.casecmp?(name) }.map(&:last)
          values.empty? ? nil : values.join(", ")
        end
      end

      # One TCP connection driven byte by byte. Every read has a deadline;
      # nothing here sleeps.
      class Client
        attr_reader :socket, :buffer

        def initialize(port)
          @socket = TCPSocket.new("127.0.0.1", port)
          @socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
          @buffer = +"".b
          @eof = false
        end

        def write(bytes)
          @socket.write(bytes)
          self
        end

        def close
          @socket.close unless @socket.closed?
        end

        # Reads one response. 1xx responses are returned like any other (the
        # caller reads again for the final one). Raises on timeout or EOF
        # before a whole response arrived.
        def read_response(timeout: IO_TIMEOUT, head_request: false)
          deadline = now + timeout
          fill(deadline) until (idx = @buffer.index("\r\n\r\n"))
          head = @buffer.slice!(0, idx + 4)
          lines = head.split("\r\n")
          status_line = lines.shift
          headers = lines.map do |line|
            name, value = line.split(":", 2)
            raise "malformed response header line #{line.inspect}" if value.nil?

            [name, value.strip]
          end
          resp = Response.new(status_line, headers, +"".b, head.dup)
          code = resp.status
          return resp if code < 200 || code == 204 || code == 304 || head_request

          if resp["transfer-encoding"]&.match?(/chunked\z/i)
            read_chunked(resp, deadline)
          elsif (len = resp["content-length"])
            n = Integer(len, 10)
            fill(deadline) while @buffer.bytesize < n
            resp.body << @buffer.slice!(0, n)
          else
            fill(deadline) until @eof
            resp.body << @buffer.slice!(0, @buffer.bytesize)
          end
          resp.raw << resp.body
          resp
        end

        # Waits for the peer to close. Returns :eof (orderly close, no more
        # bytes), :reset (RST), :data (bytes arrived first; see #buffer) or
        # :timeout.
        def wait_close(timeout: IO_TIMEOUT)
          return :data unless @buffer.empty?
          return :eof if @eof

          deadline = now + timeout
          loop do
            left = deadline - now
            return :timeout if left <= 0
            return :timeout unless @socket.wait_readable(left)

            chunk = @socket.read_nonblock(65_536, exception: false)
            next if chunk == :wait_readable
            return :eof if chunk.nil?

            @buffer << chunk
            return :data
          end
        rescue Errno::ECONNRESET
          :reset
        end

        # True when nothing at all arrives within timeout (the connection
        # stays open and silent).
        def silent_for?(timeout)
          return false unless @buffer.empty?

          !@socket.wait_readable(timeout)
        end

        private

        def now
          Process.clock_gettime(Process::CLOCK_MONOTONIC)
        end

        def fill(deadline)
          raise EOFError, "server closed the connection; got #{@buffer.inspect}" if @eof

          left = deadline - now
          unless left.positive? && @socket.wait_readable(left)
            raise Minitest::Assertion, "no complete response within the deadline; got #{@buffer.inspect}"
          end

          chunk = @socket.read_nonblock(65_536, exception: false)
          return if chunk == :wait_readable

          if chunk.nil?
            @eof = true
          else
            @buffer << chunk
          end
        end

        def read_chunked(resp, deadline)
          loop do
            fill(deadline) until (idx = @buffer.index("\r\n"))
            size = @buffer.slice!(0, idx + 2)[/\A\h+/].to_i(16)
            if size.zero?
              fill(deadline) until (idx = @buffer.index("\r\n\r\n")) || @buffer.start_with?("\r\n")
              @buffer.start_with?("\r\n") ? @buffer.slice!(0, 2) : @buffer.slice!(0, idx + 4)
              return
            end
            fill(deadline) while @buffer.bytesize < size + 2
            resp.body << @buffer.slice!(0, size)
            raise "chunk not followed by CRLF" unless @buffer.slice!(0, 2) == "\r\n"
          end
        end
      end

      # An app that records [method, path, body] of every call in a Queue and
      # answers 200 with "ok <path> <body bytes> <sha256>".
      def recording_app(calls)
        lambda do |env|
          body = env["rack.input"].read
          calls << [env["REQUEST_METHOD"], env["PATH_INFO"], body]
          text = "ok #{env['PATH_INFO']} #{body.bytesize} #{Digest::SHA256.hexdigest(body)}"
          [200, { "content-type" => "text/plain" }, [text]]
        end
      end

      def drain_queue(queue)
        out = []
        out << queue.pop until queue.empty?
        out
      end

      def good_request(path, host: "example.test")
        "GET #{path} HTTP/1.1\r\nHost: #{host}\r\n\r\n"
      end

      # A fresh connection is served normally; its request is the only one
      # the app sees after a rejected request (calls is the app's Queue).
      def assert_serves_fresh_request(port, calls, path: "/fresh", prior: [])
        client = Client.new(port)
        client.write(good_request(path))
        resp = client.read_response
        assert_equal "HTTP/1.1 200 OK", resp.status_line
        assert_match(/\Aok #{Regexp.escape(path)} 0 /, resp.body)
        client.close
        # The app runs before the response is written, so this call is in
        # the queue already; anything else in it came from the bad request.
        assert_equal prior + [["GET", path]], drain_queue(calls).map { |m, p, _| [m, p] },
                     "only the fresh request may reach the app"
      end

      # Sends bytes on a new connection and checks the whole rejection: exact
      # status line, connection: close, EOF after the response, app not called,
      # and a fresh request still served.
      # before: status lines of good pipelined responses expected first;
      # prior: the [method, path] app calls those produce.
      def assert_rejected(port, calls, bytes, status_line, before: [], prior: [])
        client = Client.new(port)
        client.write(bytes)
        before.each do |expected|
          resp = client.read_response
          assert_equal expected, resp.status_line, "response before the bad request"
        end
        resp = client.read_response
        assert_equal status_line, resp.status_line, "response to #{bytes.inspect}"
        assert_equal "close", resp["connection"]
        assert_equal :eof, client.wait_close, "server must close after #{status_line}"
        client.close
        assert_serves_fresh_request(port, calls, prior: prior)
        resp
      end
    end
  end
end
