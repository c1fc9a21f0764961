# frozen_string_literal: true

require "socket"
require "securerandom"
require "digest/sha1"

module RailsIntegration
  # A minimal RFC 6455 client over a plain TCP socket, enough for one Action
  # Cable conversation: the opening handshake (section 4.1), masked text
  # frames from the client (5.2, 5.3), unmasked frames from the server,
  # fragmented messages (5.4), ping/pong (5.5.2) and close (5.5.1).
  # Every read is bounded by a deadline.
  class WebSocketClient
    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" # RFC 6455 section 1.3
    OPCODES = { continuation: 0, text: 1, binary: 2, close: 8, ping: 9, pong: 10 }.freeze

    class Error < StandardError; end

    attr_reader :response_head, :protocol

    def initialize(host, port, path, origin:, protocols: [], timeout: 10)
      @timeout = timeout
      @socket = TCPSocket.new(host, port)
      @buffer = +"".b
      handshake(host, port, path, origin, protocols)
    end

    # Sends one text message (a single masked frame).
    def send_text(text)
      write_frame(OPCODES[:text], text.b)
    end

    # The next text message from the server; answers pings on the way.
    def read_text(timeout: @timeout)
      deadline = now + timeout
      message = nil
      loop do
        fin, opcode, payload = read_frame(deadline)
        case opcode
        when OPCODES[:ping] then write_frame(OPCODES[:pong], payload)
        when OPCODES[:pong] then next
        when OPCODES[:close] then raise Error, "server closed the WebSocket (#{close_reason(payload)})"
        when OPCODES[:text], OPCODES[:binary] then message = payload
        when OPCODES[:continuation]
          raise Error, "continuation frame without a first frame" unless message

          message << payload
        else raise Error, "unknown opcode #{opcode}"
        end
        return message.force_encoding(Encoding::UTF_8) if fin && message
      end
    end

    # Sends a close frame (status 1000) and waits, bounded, for the server's.
    def close(timeout: 2)
      write_frame(OPCODES[:close], [1000].pack("n"))
      deadline = now + timeout
      loop do
        _fin, opcode, = read_frame(deadline)
        break if opcode == OPCODES[:close]
      end
    rescue Error, IOError, SystemCallError
      nil
    ensure
      @socket.close unless @socket.closed?
    end

    private

    def handshake(host, port, path, origin, protocols)
      key = [SecureRandom.random_bytes(16)].pack("m0")
      head = +"GET #{path} HTTP/1.1\r\nHost: #{host}:#{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" \
              "Sec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\nOrigin: #{origin}\r\n"
      head << "Sec-WebSocket-Protocol: #{protocols.join(', ')}\r\n" unless protocols.empty?
      @socket.write(head << "\r\n")
      @response_head = read_until("\r\n\r\n", now + @timeout)
      status = @response_head[%r{\AHTTP/1\.1 (\d{3})}, 1]
      raise Error, "handshake answered #{@response_head.lines.first.inspect}\n#{@response_head}" unless status == "101"

      headers = @response_head.lines.drop(1).filter_map { |l| l.split(":", 2).map(&:strip) if l.include?(":") }
                              .to_h { |k, v| [k.downcase, v] }
      expected = [Digest::SHA1.digest(key + GUID)].pack("m0")
      raise Error, "bad Sec-WebSocket-Accept #{headers['sec-websocket-accept'].inspect}" unless headers["sec-websocket-accept"] == expected

      @protocol = headers["sec-websocket-protocol"]
    end

    def write_frame(opcode, payload)
      mask = SecureRandom.random_bytes(4)
      frame = [0x80 | opcode].pack("C")
      len = payload.bytesize
      frame << if len < 126 then [0x80 | len].pack("C")
               elsif len < 65_536 then [0x80 | 126, len].pack("Cn")
               else [0x80 | 127, len].pack("CQ>")
               end
      frame << mask << mask_bytes(payload, mask)
      @socket.write(frame)
    end

    def mask_bytes(payload, mask)
      keys = mask.bytes
      payload.bytes.each_with_index.map { |b, i| b ^ keys[i % 4] }.pack("C*")
    end

    def read_frame(deadline)
      b0, b1 = read_exact(2, deadline).unpack("CC")
      len = b1 & 0x7f
      len = read_exact(2, deadline).unpack1("n") if len == 126
      len = read_exact(8, deadline).unpack1("Q>") if len == 127
      mask = (b1 & 0x80).zero? ? nil : read_exact(4, deadline)
      raise Error, "server frame is masked (RFC 6455 section 5.1)" if mask

      [(b0 & 0x80) != 0, b0 & 0x0f, read_exact(len, deadline)]
    end

    def close_reason(payload)
      return "no status" if payload.bytesize < 2

      "#{payload.unpack1('n')} #{payload.byteslice(2..)}"
    end

    def read_until(marker, deadline)
      until (i = @buffer.index(marker))
        fill(deadline)
      end
      @buffer.slice!(0, i + marker.bytesize)
    end

    def read_exact(n, deadline)
      fill(deadline) while @buffer.bytesize < n
      @buffer.slice!(0, n)
    end

    def fill(deadline)
      left = deadline - now
      raise Error, "timed out waiting for the server" if left <= 0 || !@socket.wait_readable(left)

      chunk = @socket.read_nonblock(65_536, exception: false)
      raise Error, "server closed the connection" if chunk.nil?

      @buffer << chunk unless chunk == :wait_readable
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
