# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"

# Full hijack (env["rack.hijack"].call) and partial hijack (a rack.hijack
# response header), through Rack::Lint.
class HijackTest < Minitest::Test
  include Serval::HttpWire

  RAW = "HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\nx-by: app\r\n\r\nraw ok"

  class ClosedBody
    def initialize(closed) = @closed = closed
    def each = yield("ignored body")
    def close = @closed << :closed
  end

  def ok_app(env)
    [200, { "content-type" => "text/plain" }, ["fine #{env['PATH_INFO']}"]]
  end

  def test_full_hijack_app_writes_raw_bytes_and_closes
    app = lambda do |env|
      next ok_app(env) unless env["PATH_INFO"] == "/hijack"

      io = env["rack.hijack"].call
      io.write(RAW)
      io.close
      [200, {}, []] # ignored after a full hijack
    end
    with_server(app) do |_server, port|
      assert_equal RAW, raw_request(port, "GET /hijack HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "fine /after", http(port, "GET /after HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").body
    end
  end

  # The hijacked socket belongs to the app: the worker thread is free again
  # (max_threads 1 serves another request) while the app talks both ways on it.
  def test_full_hijack_frees_the_thread_and_the_socket_is_bidirectional
    hijacked = Queue.new
    app = lambda do |env|
      next ok_app(env) unless env["PATH_INFO"] == "/ws"

      io = env["rack.hijack"].call
      hijacked << [io, env["rack.hijack_io"]]
      [200, {}, []]
    end
    with_server(app, max_threads: 1) do |_server, port|
      client = connect(port)
      client.write("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
      io, hijack_io = hijacked.pop
      assert_kind_of IO, io
      assert_same io, hijack_io
      refute io.closed?

      assert_equal "fine /other", http(port, "GET /other HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").body

      client.write("ping")
      assert_equal "ping", io.readpartial(4)
      io.write("pong")
      assert_equal "pong", client.read_exact(4)
      io.close
      assert client.closed_by_peer?
      assert_empty client.buffered, "the server wrote nothing of its own on the hijacked socket"
    end
  end

  # The rack.hijack response header is called with the socket after the
  # server wrote the head: the callback waits until the client has read the
  # head, so calling it first would deadlock.
  def test_partial_hijack_gets_the_socket_after_the_head_was_written
    gate = Queue.new
    closed = Queue.new
    hijacker = lambda do |stream|
      gate.pop
      stream.write("streamed ")
      stream.write("by the app")
      stream.close
    end
    app = lambda do |env|
      next ok_app(env) unless env["PATH_INFO"] == "/partial"

      [200, { "content-type" => "text/plain", "rack.hijack" => hijacker }, ClosedBody.new(closed)]
    end
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET /partial HTTP/1.1\r\nHost: h\r\n\r\n")
      head = client.read_until("\r\n\r\n")
      lines = head.split("\r\n")
      assert_equal "HTTP/1.1 200 OK", lines[0]
      assert_includes lines, "content-type: text/plain"
      refute(lines.any? { |l| l =~ /\A(rack\.hijack|content-length|transfer-encoding)/i }, head)
      gate << :go
      assert_equal "streamed by the app", client.read_to_eof
      assert_equal :closed, closed.pop, "the ignored body is still closed"
      assert_equal "fine /after", http(port, "GET /after HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").body
    end
  end

  def test_partial_hijack_can_read_what_the_client_sends_next
    hijacker = lambda do |stream|
      line = stream.read(5)
      stream.write("echo:#{line}")
      stream.close
    end
    app = ->(_env) { [200, { "rack.hijack" => hijacker }, []] }
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      assert client.read_until("\r\n\r\n").start_with?("HTTP/1.1 200 OK\r\n")
      client.write("hello")
      assert_equal "echo:hello", client.read_to_eof
    end
  end
end
