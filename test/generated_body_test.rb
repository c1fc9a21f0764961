# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "tempfile"

# Generated bodies of known length (an `each` that is not an Array, with a
# content-length header: an Enumerator in a Rack::BodyProxy, Rack::Files'
# range bodies) never hold a thread for a slow client: they are buffered
# and spilled like an Array, and the event loop finishes them. A declared
# length the body does not keep never desynchronises the connection.
# Bodies without a length still stream (test/streaming_test.rb).
class GeneratedBodyTest < Minitest::Test
  include Serval::HttpWire

  MB = 1 << 20
  EIGHT = Random.new(30).bytes(8 * MB).freeze
  CHUNK = 64 * 1024
  H = "Host: h\r\n"

  # Counts events from app threads; waits for a number with a deadline
  # (Queue#pop has no timeout on Ruby 3.1).
  class Counter
    def initialize
      @n = 0
      @mutex = Mutex.new
      @cond = ConditionVariable.new
    end

    def bump
      @mutex.synchronize do
        @n += 1
        @cond.broadcast
      end
    end

    def count
      @mutex.synchronize { @n }
    end

    # The count once it reached n, or what it was when seconds passed.
    def wait_for(n, seconds = 10)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      @mutex.synchronize do
        while @n < n
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return @n if left <= 0

          @cond.wait(@mutex, left)
        end
        @n
      end
    end
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # data yielded in CHUNK slices by an Enumerator: never an Array.
  def generated(data)
    Enumerator.new do |y|
      (0...data.bytesize).step(CHUNK) { |at| y << data.byteslice(at, CHUNK) }
    end
  end

  # Small kernel buffers on the server's side (accepted sockets inherit the
  # listener's SO_SNDBUF) and a small window on the client's, so unread
  # responses stay in Serval instead of in the kernels.
  def small_send_buffers(server)
    server.instance_variable_get(:@listeners).each { |l| l.setsockopt(Socket::SOL_SOCKET, Socket::SO_SNDBUF, 16_384) }
  end

  def slow_socket(port)
    s = Socket.new(:INET, :STREAM)
    s.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, 8192)
    s.connect(Socket.sockaddr_in(port, "127.0.0.1"))
    s
  end

  # The issue's case with a generated body: 4 threads, 6 clients that do not
  # read an 8 MB Enumerator body with a content-length. Every body is
  # produced and closed (its thread is done with it) while no client has
  # read, a 7th client is answered at once, and then each slow client reads
  # its body byte-exact and its connection is still good for the next request.
  def test_slow_readers_of_a_generated_body_with_a_length_hold_no_thread
    closed = Counter.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/big"
        [200, { "content-type" => "application/octet-stream", "content-length" => EIGHT.bytesize.to_s },
         Rack::BodyProxy.new(generated(EIGHT)) { closed.bump }]
      else
        [200, { "content-type" => "text/plain" }, ["fresh"]]
      end
    end
    sockets = []
    with_server(app, max_threads: 4, write_timeout: 60) do |server, port|
      small_send_buffers(server)
      6.times do
        s = slow_socket(port)
        s.write("GET /big HTTP/1.1\r\n#{H}\r\n")
        sockets << s
      end
      assert_equal 6, closed.wait_for(6, 10), "all 6 bodies produced with 4 threads: no thread waits for a reader"
      assert_operator server.stats[:output_spills], :>=, 6

      t0 = now
      res = http(port, "GET /fresh HTTP/1.1\r\n#{H}Connection: close\r\n\r\n", timeout: 5)
      assert_equal [200, "fresh"], [res.status, res.body]
      assert_operator now - t0, :<, 2.0, "a 7th client is answered at once"

      sockets.each do |sock|
        client = Client.new(sock, timeout: 20)
        late = client.read_response
        assert_equal [200, EIGHT.bytesize.to_s], [late.status, late["content-length"]]
        refute late["transfer-encoding"]
        assert late.body == EIGHT, "8 MB generated body byte-exact"
        client.write("GET /fresh HTTP/1.1\r\n#{H}\r\n")
        assert_equal "fresh", client.read_response.body, "the connection stays in step"
      end
    end
  ensure
    sockets.each(&:close)
  end

  # A client that keeps up gets each chunk when it is made, not when the
  # output buffer fills: the body yields its next chunk only once the
  # previous one arrived (a proxied download, a slow export).
  def test_each_chunk_reaches_a_client_that_keeps_up
    arrived = Counter.new
    words = %w[first second third]
    body = Enumerator.new do |y|
      words.each_with_index do |word, i|
        y << word
        arrived.wait_for(i + 1, 5) >= i + 1 or raise "#{word} never reached the client"
      end
    end
    app = ->(_env) { [200, { "content-length" => words.join.bytesize.to_s }, body] }
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET / HTTP/1.1\r\n#{H}\r\n")
      head = client.read_until("\r\n\r\n")
      assert_includes head, "content-length: #{words.join.bytesize}\r\n"
      refute_match(/transfer-encoding/i, head)
      words.each do |word|
        assert_equal word, client.read_exact(word.bytesize)
        arrived.bump
      end
      client.write("GET / HTTP/1.1\r\n#{H}\r\n")
      assert_equal "firstsecondthird", client.read_response.body, "kept alive"
    end
  end

  # Declared 10, yielded 3: the client gets the head and the 3 bytes, then
  # the connection closes; the pipelined request behind it is not answered
  # on this connection (it would be read as the rest of the body).
  def test_a_generated_body_shorter_than_declared_closes_the_connection
    app = lambda do |env|
      if env["PATH_INFO"] == "/short"
        [200, { "content-length" => "10" }, Enumerator.new { |y| y << "abc" }]
      else
        [200, {}, ["second"]]
      end
    end
    with_server(app, lint: false) do |_server, port| # Rack::Lint would raise on the mismatch
      client = connect(port)
      client.write("GET /short HTTP/1.1\r\n#{H}\r\nGET /next HTTP/1.1\r\n#{H}\r\n")
      out = client.read_to_eof
      assert_match(%r{\AHTTP/1.1 200 OK\r\n}, out)
      assert_includes out, "content-length: 10\r\n"
      assert out.end_with?("\r\n\r\nabc"), out
      assert_equal 1, out.scan("HTTP/1.1").size, "one response, then the close"
    end
  end

  # Declared 4, the body would yield 12: the first 4 bytes go out, the rest
  # is not sent, the body is not iterated past the chunk that overflowed,
  # and the connection closes.
  def test_a_generated_body_longer_than_declared_is_cut_and_closes
    yielded = Counter.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/long"
        body = Enumerator.new do |y|
          %w[abcd efgh ijkl].each do |chunk|
            yielded.bump
            y << chunk
          end
        end
        [200, { "content-length" => "4" }, body]
      else
        [200, {}, ["second"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      client.write("GET /long HTTP/1.1\r\n#{H}\r\nGET /next HTTP/1.1\r\n#{H}\r\n")
      out = client.read_to_eof
      assert out.end_with?("content-length: 4\r\n" + out[/date: [^\r]*\r\n\r\n/].to_s + "abcd"), out
      assert_equal 1, out.scan("HTTP/1.1").size, "one response, then the close"
      assert_equal 2, yielded.count, "not iterated past the chunk that overflowed"
    end
  end

  # A short body that was spilled (the client did not read): the thread is
  # done, the loop sends every byte it had, then closes instead of waiting
  # for the bytes that never came.
  def test_a_spilled_body_shorter_than_declared_arrives_then_closes
    closed = Counter.new
    declared = EIGHT.bytesize + 100
    app = lambda do |_env|
      [200, { "content-length" => declared.to_s }, Rack::BodyProxy.new(generated(EIGHT)) { closed.bump }]
    end
    sock = nil
    with_server(app, lint: false, max_threads: 2, write_timeout: 60, output_buffer: 65_536) do |server, port|
      small_send_buffers(server)
      sock = slow_socket(port)
      sock.write("GET / HTTP/1.1\r\n#{H}\r\nGET / HTTP/1.1\r\n#{H}\r\n")
      assert_equal 1, closed.wait_for(1, 10), "the thread finished without the client reading"
      assert_operator server.stats[:output_spills], :>=, 1
      client = Client.new(sock, timeout: 20)
      head = client.read_until("\r\n\r\n")
      assert_includes head, "content-length: #{declared}\r\n"
      rest = client.read_to_eof
      assert_equal EIGHT.bytesize, rest.bytesize, "every byte the body had, then the close"
      assert rest == EIGHT
      assert_equal 1, closed.count, "the pipelined request was not served on this connection"
    end
  ensure
    sock&.close
  end

  # HEAD, 204 and 304 with generated bodies, then a full one, all on one
  # keep-alive connection: no body bytes where none belong.
  def test_head_204_304_with_generated_bodies_keep_the_connection_in_step
    app = lambda do |env|
      body = Enumerator.new { |y| y << "hello" }
      case env["PATH_INFO"]
      when "/204" then [204, { "content-length" => "5" }, body]
      when "/304" then [304, { "content-length" => "5", "etag" => "\"x\"" }, body]
      else [200, { "content-length" => "5" }, body]
      end
    end
    with_server(app, lint: false) do |_server, port| # Lint forbids a content-length on 204/304
      client = connect(port)
      client.write("HEAD / HTTP/1.1\r\n#{H}\r\n")
      res = client.read_response(head_request: true)
      assert_equal [200, "5"], [res.status, res["content-length"]]
      client.write("GET /204 HTTP/1.1\r\n#{H}\r\n")
      res = client.read_response
      assert_equal [204, nil], [res.status, res["content-length"]]
      client.write("GET /304 HTTP/1.1\r\n#{H}\r\n")
      assert_equal 304, client.read_response.status
      client.write("GET / HTTP/1.1\r\n#{H}\r\n")
      res = client.read_response
      assert_equal [200, "hello"], [res.status, res.body]
      assert_empty client.buffered, "nothing after the last response"
    end
  end

  # Rack::Files answers a Range with a body that has a to_path but a
  # content-length other than the file's size, so it is generated: a client
  # that does not read it holds no thread, and gets exactly its range.
  def test_a_range_from_rack_files_is_buffered_not_streamed
    require "rack/files"
    Tempfile.create("serval-range") do |file|
      file.binmode
      file.write(EIGHT)
      file.flush
      closed = Counter.new
      files = Rack::Files.new(File.dirname(file.path))
      app = lambda do |env|
        status, headers, body = files.call(env)
        [status, headers, Rack::BodyProxy.new(body) { closed.bump }]
      end
      sock = nil
      with_server(app, max_threads: 1, write_timeout: 60, output_buffer: 65_536) do |server, port|
        small_send_buffers(server)
        sock = slow_socket(port)
        sock.write("GET /#{File.basename(file.path)} HTTP/1.1\r\n#{H}Range: bytes=1000-6000999\r\n\r\n")
        assert_equal 1, closed.wait_for(1, 10), "the only thread is done with the range"
        res = http(port, "GET /#{File.basename(file.path)} HTTP/1.1\r\n#{H}Range: bytes=0-9\r\nConnection: close\r\n\r\n")
        assert_equal [206, EIGHT.byteslice(0, 10)], [res.status, res.body], "the one thread answers the next client"
        late = Client.new(sock, timeout: 20).read_response
        assert_equal [206, "6000000"], [late.status, late["content-length"]]
        assert late.body == EIGHT.byteslice(1000, 6_000_000), "the range byte-exact"
      end
    ensure
      sock&.close
    end
  end

  # Which path a body takes, seen from the Request the writer drives:
  # write_nowait (buffered, never waits) or stream_write (each chunk waited
  # for). A stand-in for ActionController::Live::Buffer when Rails is not
  # loaded, as in this suite.
  class RecordingRequest
    attr_reader :calls

    def initialize
      @calls = []
    end

    def write_head(*)
      @calls << :head
      true
    end

    def write_nowait(_chunk)
      @calls << :write_nowait
    end

    def stream_write(_chunk)
      @calls << :stream_write
    end
  end

  module ::ActionController
    module Live
      class Buffer; end
    end
  end unless defined?(::ActionController::Live::Buffer)

  # Rails' RackBody: #response, whose #stream is the Live::Buffer.
  LiveBody = Struct.new(:response) do
    def each
      yield "a"
      yield "b"
    end
  end
  LiveResponse = Struct.new(:stream)

  def path_for(headers, body = Enumerator.new { |y| y << "a" << "b" })
    request = RecordingRequest.new
    Serval::ResponseWriter.new.write(request, {}, 200, headers, body)
    request.calls.uniq - [:head]
  end

  def test_which_bodies_are_buffered_and_which_stream
    require "serval/response_writer"
    assert_equal [:write_nowait], path_for({ "content-length" => "2" })
    assert_equal [:write_nowait], path_for({ "Content-Length" => "2" }), "any case, as sv_write_head reads it"
    assert_equal [:write_nowait], path_for(Rack::Headers.new.merge!("Content-Length" => "2"))
    assert_equal [:write_nowait], path_for({ "content-length" => 2 }), "an Integer length (written leniently)"
    assert_equal [:stream_write], path_for({}), "no length: streamed"
    assert_equal [:stream_write], path_for({ "content-length" => nil }), "nil: as if absent (sv_write_head)"
    live = LiveBody.new(LiveResponse.new(::ActionController::Live::Buffer.allocate))
    assert_equal [:stream_write], path_for({ "content-length" => "2" }, Rack::BodyProxy.new(live) {}),
                 "ActionController::Live streams even with a length"
    not_live = LiveBody.new(LiveResponse.new(Object.new))
    assert_equal [:write_nowait], path_for({ "content-length" => "2" }, not_live)
  end
end
