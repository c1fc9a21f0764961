# frozen_string_literal: true

require "socket"

module Bench
  # A tiny, deadline-bounded HTTP/1.1 client for readiness checks, sanity
  # checks and latency probes. One request per connection (connection: close).
  module HTTP
    class Timeout < StandardError; end

    Response = Struct.new(:status, :headers, :body, :seconds, keyword_init: true)

    module_function

    def get(host, port, path, timeout: 5)
      started = Util.now
      deadline = started + timeout
      sock = Socket.tcp(host, port, connect_timeout: timeout)
      request = "GET #{path} HTTP/1.1\r\nHost: #{host}:#{port}\r\nConnection: close\r\n\r\n"
      write_all(sock, request, deadline)
      raw = read_response(sock, deadline)
      status, headers, body = parse(raw)
      Response.new(status: status, headers: headers, body: body, seconds: Util.now - started)
    rescue Errno::ETIMEDOUT
      raise Timeout, "timed out after #{timeout}s"
    ensure
      sock&.close
    end

    def write_all(sock, data, deadline)
      until data.empty?
        n = sock.write_nonblock(data, exception: false)
        if n == :wait_writable
          left = deadline - Util.now
          raise Timeout, "write timed out" if left <= 0 || !sock.wait_writable(left)
        else
          data = data.byteslice(n..)
        end
      end
    end

    # Read until the head is complete and content-length bytes followed, or EOF.
    def read_response(sock, deadline)
      buf = +"".b
      want = nil
      loop do
        if want.nil? && (head_end = buf.index("\r\n\r\n"))
          length = buf[0, head_end][/^content-length:\s*(\d+)/i, 1]
          want = length ? head_end + 4 + Integer(length) : Float::INFINITY
        end
        return buf if want && buf.bytesize >= want

        left = deadline - Util.now
        raise Timeout, "read timed out" if left <= 0

        chunk = sock.read_nonblock(65_536, exception: false)
        case chunk
        when :wait_readable
          raise Timeout, "read timed out" unless sock.wait_readable(left)
        when nil
          return buf
        else
          buf << chunk
        end
      end
    end

    def parse(raw)
      head, body = raw.split("\r\n\r\n", 2)
      lines = head.to_s.split("\r\n")
      status = lines.shift.to_s[%r{\AHTTP/1\.[01] (\d{3})}, 1]
      raise Timeout, "no HTTP response (#{raw.bytesize} bytes)" unless status

      headers = lines.to_h do |line|
        name, value = line.split(":", 2)
        [name.downcase, value.to_s.strip]
      end
      [Integer(status), headers, body.to_s]
    end
  end
end
