# frozen_string_literal: true

require "socket"
require "io/wait"
require "digest"

module Serval
  # The HTTP/1.x client of the test suite. Client reads exactly one response
  # at a time from a socket (content-length, chunked or close-delimited), so
  # keep-alive connections, pipelining and exact bytes can be checked; it also
  # writes raw bytes (malformed requests, partial heads, trickles) and watches
  # how the peer closes. Every read has a deadline and raises WireTimeout
  # instead of hanging. LoadClient runs many keep-alive clients at once.
  #
  # Include the module into a test class for connect/http/get (clients are
  # closed in teardown) and the request assertions (assert_rejected...).
  module HttpWire
    class WireTimeout < StandardError; end

    IO_TIMEOUT = 5
    CLIENTS_LOCK = Mutex.new

    Response = Struct.new(:status, :reason, :headers, :body, :head, :raw_body, keyword_init: true) do
      # All values of a header (names compared case-insensitively).
      def values(name)
        headers.select { |k, _| k.casecmp?(name) }.map(&:last)
      end

      # The first value of a header, or nil.
      def [](name)
        values(name).first
      end

      # The field value as a recipient combines repeated lines: all values
      # joined with ", " (nil when absent). A duplicated header shows here.
      def field(name)
        all = values(name)
        all.empty? ? nil : all.join(", ")
      end

      # "HTTP/1.1 200 OK"
      def status_line
        head[/\A[^\r\n]*/]
      end

      # The response as received: head and body bytes (chunk framing included).
      def raw
        head + raw_body
      end
    end

    class Client
      attr_reader :socket, :bytes_read

      # port: an Integer (connects to host) or an already open socket.
      # timeout: seconds each read may wait for more bytes.
      def initialize(port, timeout: IO_TIMEOUT, host: "127.0.0.1")
        if port.is_a?(IO)
          @socket = port
        else
          @socket = TCPSocket.new(host, port)
          # Each write leaves at once: tests that trickle bytes mean it.
          @socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
        end
        @buffer = +"".b
        @timeout = timeout
        @bytes_read = 0
      end

      def write(bytes)
        @socket.write(bytes)
        self
      end

      def close
        @socket.close unless @socket.closed?
      end

      def closed?
        @socket.closed?
      end

      # Reads one response. head_request: the response to a HEAD has no body.
      # 1xx responses are returned like any other (read again for the final
      # one). timeout: overrides the client's read timeout for this response.
      def read_response(head_request: false, timeout: nil)
        return with_timeout(timeout) { read_response(head_request: head_request) } if timeout

        head = read_until("\r\n\r\n")
        status_line, *lines = head.split("\r\n")
        m = %r{\AHTTP/1\.[01] (\d{3}) ?(.*)\z}.match(status_line) or raise "bad status line #{status_line.inspect}"
        headers = lines.map do |l|
          name, value = l.split(":", 2)
          [name, value.to_s.delete_prefix(" ")]
        end
        response = Response.new(status: m[1].to_i, reason: m[2], headers: headers, head: head)
        length = response["content-length"]
        if head_request || response.status < 200 || [204, 304].include?(response.status)
          response.body = response.raw_body = "".b
        elsif response.field("transfer-encoding")&.match?(/(?:\A|,)\s*chunked\s*\z/i)
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

      # Reads until the bytes received and not yet consumed match pattern;
      # returns the MatchData and consumes nothing (a stream read as it grows).
      def read_until_match(pattern)
        until (match = pattern.match(@buffer))
          fill
        end
        match
      end

      # Everything until the peer closes; raises WireTimeout if it does not.
      def read_to_eof
        loop { break unless fill(eof_ok: true) }
        @buffer.slice!(0, @buffer.bytesize)
      end

      # Everything until the peer closes (EOF or reset) or timeout seconds
      # have passed in total, whichever comes first; never raises.
      def read_all(timeout: @timeout)
        deadline = now + timeout
        loop do
          left = deadline - now
          break if left <= 0 || !@socket.wait_readable(left)

          chunk = read_chunk
          break if chunk.nil? || chunk == :reset

          @buffer << chunk unless chunk == :wait_readable
        end
        @buffer.slice!(0, @buffer.bytesize)
      end

      # True once the peer has closed (EOF or reset) with nothing more to read.
      def closed_by_peer?
        fill(eof_ok: true) ? false : @buffer.empty?
      end

      # Waits for the peer to close. Returns :eof (orderly close, no more
      # bytes), :reset (RST), :data (bytes arrived first or were already
      # buffered; see #buffered) or :timeout. timeout 0 looks without waiting.
      def wait_close(timeout: @timeout)
        return :data unless @buffer.empty?

        read_more(timeout)
      end

      # Waits up to timeout seconds for more bytes and appends them to the
      # buffer. Returns :data, :eof, :reset or :timeout; never raises.
      def read_more(timeout = @timeout)
        deadline = now + timeout
        loop do
          return :timeout unless @socket.wait_readable([deadline - now, 0].max)

          chunk = read_chunk
          next if chunk == :wait_readable
          return :eof if chunk.nil?
          return :reset if chunk == :reset

          @buffer << chunk
          return :data
        end
      end

      # True when nothing at all arrives within seconds (the connection stays
      # open and silent; a close counts as something arriving).
      def silent_for?(seconds)
        @buffer.empty? && !@socket.wait_readable(seconds)
      end

      # Bytes received but not yet consumed by a read.
      def buffered
        @buffer
      end
      alias buffer buffered

      private

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      def with_timeout(seconds)
        saved = @timeout
        @timeout = seconds
        yield
      ensure
        @timeout = saved
      end

      # Up to 64 KiB, :wait_readable, nil at EOF or :reset.
      def read_chunk
        chunk = @socket.read_nonblock(65_536, exception: false)
        @bytes_read += chunk.bytesize if chunk.is_a?(String)
        chunk
      rescue Errno::ECONNRESET
        :reset
      end

      def read_chunked(response)
        raw = +"".b
        body = +"".b
        loop do
          size_line = read_until("\r\n")
          raw << size_line
          size = Integer(size_line.chomp.split(";").first.strip, 16)
          if size.zero?
            loop do # trailer fields, then the empty line
              line = read_until("\r\n")
              raw << line
              break if line == "\r\n"
            end
            break
          end
          chunk = read_exact(size + 2)
          raise "chunk not followed by CRLF: #{chunk.byteslice(size, 2).inspect}" unless chunk.end_with?("\r\n")

          raw << chunk
          body << chunk.byteslice(0, size)
        end
        response.body = body
        response.raw_body = raw
      end

      # Reads more bytes into the buffer; false at EOF (or reset) when eof_ok.
      def fill(eof_ok: false)
        deadline = now + @timeout
        loop do
          left = deadline - now
          raise WireTimeout, "no data within #{@timeout}s (buffered #{@buffer.bytesize} bytes: #{@buffer[0, 200].inspect})" if left <= 0

          @socket.wait_readable(left)
          chunk = read_chunk
          next if chunk == :wait_readable
          if chunk.nil? || chunk == :reset
            return false if eof_ok

            raise EOFError, "connection closed (buffered #{@buffer.bytesize} bytes: #{@buffer[0, 200].inspect})"
          end
          @buffer << chunk
          return true
        end
      end
    end

    # Continuous HTTP load for the zero-drop tests and the restarts bench:
    # `threads` Clients, each sending GET requests on keep-alive connections
    # of 1..max_per_conn requests, then opening a new one. Counting rules
    # (bench/NOTES.md, "Zero dropped requests"):
    #   ok       a complete 200 response
    #   failed   anything else: an error status, a truncated response, a reset
    #            or EOF on a new connection after the request was written, a
    #            timeout
    #   retried  a request sent on a *reused* keep-alive connection that the
    #            server closed before sending one byte of the answer: sent
    #            again once on a new connection, as HTTP clients do for
    #            idempotent requests (RFC 9112, 9.3.1); the retry's outcome is
    #            what counts
    #   refused  connect() refused or reset before the request after
    #            #refuse_from_now was called (graceful stop: the server no
    #            longer listens)
    class LoadClient
      Result = Struct.new(:ok, :failed, :retried, :refused, :errors, keyword_init: true)

      def initialize(port, threads: 4, max_per_conn: 5, path: "/", timeout: 10)
        @port = port
        @threads = threads
        @max_per_conn = max_per_conn
        @request = "GET #{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        @timeout = timeout
        @mutex = Mutex.new
        @counted = ConditionVariable.new
        @counts = Hash.new(0)
        @errors = []
        @stop = false
        @refusing = false
      end

      def start
        @workers = Array.new(@threads) { |i| Thread.new { run_client(i) } }
        self
      end

      def refuse_from_now
        @refusing = true
      end

      def refusing?
        @refusing
      end

      def ok_count
        @mutex.synchronize { @counts[:ok] }
      end

      # Blocks until at least n more requests succeeded (bounded by timeout).
      def wait_for_more(n, timeout: 10)
        deadline = now + timeout
        @mutex.synchronize do
          target = @counts[:ok] + n
          until @counts[:ok] >= target
            left = deadline - now
            return false if left <= 0

            @counted.wait(@mutex, left)
          end
          true
        end
      end

      def stop
        @stop = true
        @workers.each { |t| t.join(@timeout + 5) }
        @mutex.synchronize do
          Result.new(ok: @counts[:ok], failed: @counts[:failed], retried: @counts[:retried],
                     refused: @counts[:refused], errors: @errors.first(10))
        end
      end

      private

      def count(key, error = nil)
        @mutex.synchronize do
          @counts[key] += 1
          @errors << error if error
          @counted.broadcast
        end
      end

      def run_client(id)
        until @stop
          client = connect
          next unless client

          begin
            rand(1..@max_per_conn).times do |n|
              break if @stop

              outcome = exchange(client)
              if outcome == :ok || outcome == :ok_close
                count(:ok)
                break if outcome == :ok_close
              elsif outcome == :closed_before_answer && n.positive?
                count(:retried)
                retry_once(id)
                break
              else
                record_failure(outcome, id)
                break
              end
            end
          ensure
            client.close
          end
        end
      end

      def retry_once(id)
        client = connect
        return unless client

        outcome = exchange(client)
        outcome == :ok || outcome == :ok_close ? count(:ok) : record_failure(outcome, id)
      ensure
        client&.close
      end

      def record_failure(outcome, id)
        if @refusing && outcome == :closed_before_answer
          count(:refused)
        else
          count(:failed, "client #{id}: #{outcome}")
        end
      end

      def connect
        Client.new(@port, timeout: @timeout)
      rescue SystemCallError => e
        if @refusing
          count(:refused)
          sleep 0.005 # back off; the port is gone
        else
          count(:failed, "connect: #{e.class}")
          sleep 0.01
        end
        nil
      end

      # :ok, :ok_close, :closed_before_answer, or a failure description.
      def exchange(client)
        before = client.bytes_read
        begin
          client.write(@request)
        rescue Errno::EPIPE, Errno::ECONNRESET
          return :closed_before_answer
        end
        response = client.read_response
        return "status #{response.status}" unless response.status == 200

        response.field("connection")&.match?(/close/i) ? :ok_close : :ok
      rescue EOFError
        client.bytes_read == before ? :closed_before_answer : "truncated response"
      rescue WireTimeout
        "timeout"
      end

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end

    def connect(port, timeout: IO_TIMEOUT, **opts)
      client = Client.new(port, timeout: timeout, **opts)
      CLIENTS_LOCK.synchronize { (@wire_clients ||= []) << client }
      client
    end

    # One request on a fresh connection; returns the parsed response.
    def http(port, request, head_request: false, timeout: IO_TIMEOUT)
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

    def good_request(path, host: "example.test")
      "GET #{path} HTTP/1.1\r\nHost: #{host}\r\n\r\n"
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

    # A fresh connection is served normally; its request is the only one
    # the app sees after a rejected request (calls is the app's Queue).
    def assert_serves_fresh_request(port, calls, path: "/fresh", prior: [])
      client = connect(port)
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
      client = connect(port)
      client.write(bytes)
      before.each do |expected|
        resp = client.read_response
        assert_equal expected, resp.status_line, "response before the bad request"
      end
      resp = client.read_response
      assert_equal status_line, resp.status_line, "response to #{bytes.inspect}"
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close, "server must close after #{status_line}"
      client.close
      assert_serves_fresh_request(port, calls, prior: prior)
      resp
    end

    def teardown
      CLIENTS_LOCK.synchronize { (@wire_clients || []).each(&:close) }
      super
    end
  end
end
