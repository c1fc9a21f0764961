# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"

# Slow readers and slow uploaders cost a connection and a buffer, never a
# Ruby thread: a fresh client is still served promptly.
class SlowClientsTest < Minitest::Test
  include Serval::HttpWire

  MB = ("0123456789abcdef" * 65_536).freeze # 1 MiB

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # 200 connections ask for 1 MB and never read it. Every one of them has
  # been answered by the app (the Queue says so) before the fresh client
  # connects, so 4 threads have had to hand 200 MB of responses to the core.
  def test_200_non_reading_clients_do_not_block_a_fresh_client
    answered = Queue.new
    app = lambda do |env|
      answered << true if env["PATH_INFO"] == "/1mb"
      [200, { "content-type" => "application/octet-stream" }, env["PATH_INFO"] == "/1mb" ? [MB] : ["fresh"]]
    end
    sockets = []
    with_server(app, max_threads: 4, write_timeout: 60) do |server, port|
      # Small kernel buffers on both sides (accepted sockets inherit the
      # listener's SO_SNDBUF), so the 1 MB responses stay in Serval's own
      # buffers instead of disappearing into the kernel's.
      server.instance_variable_get(:@listeners).each { |l| l.setsockopt(Socket::SOL_SOCKET, Socket::SO_SNDBUF, 16_384) }
      200.times do
        # a small receive window (set before connect) so the 1 MB cannot
        # just sit in the client's kernel buffer
        s = Socket.new(:INET, :STREAM)
        s.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, 8192)
        s.connect(Socket.sockaddr_in(port, "127.0.0.1"))
        s.write("GET /1mb HTTP/1.1\r\nHost: h\r\n\r\n")
        sockets << s
      end
      200.times { answered.pop }
      assert_operator server.stats[:running], :<=, 4
      assert_equal 200, server.stats[:connections]

      t0 = now
      res = http(port, "GET /fresh HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout: 2)
      elapsed = now - t0
      assert_equal 200, res.status
      assert_equal "fresh", res.body
      assert_operator elapsed, :<, 2.0, "fresh client waited #{elapsed}s"

      # the slow readers' responses are intact when they finally read
      late = Client.new(sockets.first, timeout: 10).read_response
      assert_equal 200, late.status
      assert late.body == MB, "1 MB body intact"
    end
  ensure
    sockets.each(&:close)
  end

  # max_threads 1 and an upload stalled halfway: the only thread is free,
  # a fresh request is served, and the upload completes when it resumes.
  def test_slow_uploader_does_not_occupy_a_thread
    seen = Queue.new
    app = lambda do |env|
      seen << env["PATH_INFO"]
      [200, { "content-type" => "text/plain" }, ["#{env['PATH_INFO']} #{env['rack.input'].read.bytesize}"]]
    end
    with_server(app, max_threads: 1) do |_server, port|
      uploader = connect(port, timeout: 10)
      uploader.write("POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 200000\r\n\r\n")
      uploader.write("u" * 100_000)

      chunked = connect(port, timeout: 10)
      chunked.write("POST /chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")

      t0 = now
      res = http(port, "GET /fresh HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout: 2)
      assert_equal "/fresh 0", res.body
      assert_operator now - t0, :<, 2.0
      assert_equal "/fresh", seen.pop, "the stalled uploads never reached the app"

      uploader.write("u" * 100_000)
      assert_equal "/upload 200000", uploader.read_response.body
      chunked.write("0\r\n\r\n")
      assert_equal "/chunked 5", chunked.read_response.body
      assert_equal "/upload", seen.pop
      assert_equal "/chunked", seen.pop
    end
  end
end
