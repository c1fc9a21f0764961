# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require "pathname"
require "tempfile"

# Bodies of unknown length are streamed: each chunk reaches the client's
# socket when the app yields it, before the app produces the next one. The
# apps below wait for the test to have *received* chunk N before yielding
# chunk N+1, so a server that held chunks back would never finish (the read
# deadline fails the test instead of a timing threshold).
class StreamingTest < Minitest::Test
  READ_TIMEOUT = 5

  # A counting handshake with a bounded wait (Queue#pop(timeout:) is Ruby
  # 3.2+; the suite also runs on 3.1).
  class Gate
    def initialize
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @count = 0
    end

    def push(_ = nil)
      @mutex.synchronize do
        @count += 1
        @cond.broadcast
      end
    end

    # true once a push is available (and takes it); false after seconds.
    def pop(seconds = READ_TIMEOUT)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      @mutex.synchronize do
        while @count.zero?
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return false if left <= 0

          @cond.wait(@mutex, left)
        end
        @count -= 1
        true
      end
    end
  end

  # Yields each chunk, then waits until the test says it arrived.
  class GatedBody
    def initialize(chunks, arrived)
      @chunks = chunks
      @arrived = arrived
    end

    def each
      @chunks.each do |chunk|
        yield chunk
        @arrived.pop or raise "chunk #{chunk.inspect} never reached the client"
      end
    end
  end

  # The suite's client read as a stream: what the socket has delivered so
  # far, and when a pattern arrived.
  class Wire < Serval::HttpWire::Client
    def initialize(port)
      super(port, timeout: READ_TIMEOUT)
    end

    def data
      buffered
    end

    # Reads until pattern is in what arrived; returns the time it did.
    def wait_for(pattern)
      read_until_match(pattern)
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def readable_within?(seconds)
      !silent_for?(seconds)
    end
  end

  def test_enumerable_chunks_reach_the_socket_before_the_next_is_made
    arrived = Gate.new
    app = ->(_env) { [200, { "content-type" => "text/event-stream" }, GatedBody.new(%w[one two three], arrived)] }
    with_server(app) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      wire.wait_for(/\r\n\r\n/) # the head goes out before the first chunk
      %w[one two three].each do |word|
        wire.wait_for(/\r\n#{word}\r\n/)
        arrived.push(word)
      end
      wire.wait_for(/0\r\n\r\n\z/)
      assert_match(/transfer-encoding: chunked/i, wire.data)
    ensure
      wire&.close
    end
  end

  # What Rails and most middleware return: an Enumerator in a
  # Rack::BodyProxy, no content-length. Still streamed chunk by chunk (only a
  # declared length makes a generated body buffered: generated_body_test.rb).
  def test_an_enumerator_in_a_body_proxy_without_a_length_streams
    arrived = Gate.new
    app = lambda do |_env|
      body = Enumerator.new do |y|
        %w[one two].each do |word|
          y << word
          arrived.pop or raise "#{word} never reached the client"
        end
      end
      [200, { "content-type" => "text/csv" }, Rack::BodyProxy.new(body) {}]
    end
    with_server(app) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      %w[one two].each do |word|
        wire.wait_for(/\r\n#{word}\r\n/)
        arrived.push
      end
      wire.wait_for(/0\r\n\r\n\z/)
      assert_match(/transfer-encoding: chunked/i, wire.data)
    ensure
      wire&.close
    end
  end

  # The head goes out with the first chunk: nothing is sent while the body
  # has not yielded, so an error before the first chunk can still be a 500.
  def test_head_goes_out_with_the_first_chunk
    release = Gate.new
    body = Enumerator.new do |y|
      release.pop
      y << "late"
    end
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_server(app, lint: false) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      refute wire.readable_within?(0.2), "nothing before the first chunk: #{wire.data.inspect}"
      release.push
      wire.wait_for(%r{\AHTTP/1.1 200 OK\r\n.*\r\n\r\n4\r\nlate\r\n0\r\n\r\n\z}m)
    ensure
      wire&.close
    end
  end

  class RaisingBody
    def each
      raise "database went away"
    end
  end

  def test_a_body_that_raises_before_its_first_chunk_gets_a_500
    app = ->(_env) { [200, { "content-type" => "text/plain" }, RaisingBody.new] }
    with_server(app) do |_server, port|
      raw = raw_request(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_match %r{\AHTTP/1.1 500 Internal Server Error\r\n}, raw
      assert_includes @server_log_writer.stderr.string, "database went away"
    end
  end

  def test_a_stream_body_that_raises_before_writing_gets_a_500
    body = ->(_stream) { raise "no data" }
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_server(app) do |_server, port|
      raw = raw_request(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_match %r{\AHTTP/1.1 500 Internal Server Error\r\n}, raw
    end
  end

  def test_a_stream_body_that_writes_nothing_gets_an_empty_response
    body = lambda(&:close)
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_server(app) do |_server, port|
      raw = raw_request(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_match %r{\AHTTP/1.1 200 OK\r\n.*\r\n\r\n0\r\n\r\n\z}m, raw
    end
  end

  # A 1xx as the final status would be read as an interim response and the
  # client would wait for the real one: it is the app's error.
  def test_an_informational_final_status_is_an_app_error
    [100, 103, 199].each do |code|
      app = ->(_env) { [code, {}, []] }
      with_server(app, lint: false) do |_server, port|
        raw = raw_request(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert_match %r{\AHTTP/1.1 500 Internal Server Error\r\n}, raw, "status #{code}"
        assert_includes @server_log_writer.stderr.string, "status #{code} is informational"
      end
    end
  end

  def test_rack3_stream_writes_reach_the_socket_as_they_are_made
    arrived = Gate.new
    body = lambda do |stream|
      %w[alpha beta].each do |word|
        stream.write(word)
        arrived.pop or raise "#{word} never arrived"
      end
      stream << "gamma"
      stream.flush
      arrived.pop or raise "gamma never arrived"
    ensure
      stream.close
    end
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_server(app) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      %w[alpha beta gamma].each do |word|
        wire.wait_for(/\r\n#{word}\r\n/)
        arrived.push(word)
      end
      wire.wait_for(/0\r\n\r\n\z/)
    ensure
      wire&.close
    end
  end

  # The spacing the client sees follows the app's: chunks made 0.2 s apart
  # arrive spread out (buffered, they would arrive together at the end).
  # Only a lower bound: a busy machine can spread them more, never less.
  def test_arrival_spacing_follows_the_app
    body = Enumerator.new do |y|
      3.times do |i|
        sleep 0.2 if i.positive?
        y << "tick#{i}\n"
      end
    end
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_server(app, lint: false) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      times = (0..2).map { |i| wire.wait_for(/tick#{i}\n/) }
      assert_operator times[1] - times[0], :>=, 0.15, "tick1 arrived with tick0"
      assert_operator times[2] - times[1], :>=, 0.15, "tick2 arrived with tick1"
    ensure
      wire&.close
    end
  end

  def test_streamed_http10_response_is_delimited_by_close_and_still_prompt
    arrived = Gate.new
    app = ->(_env) { [200, { "content-type" => "text/plain" }, GatedBody.new(%w[first second], arrived)] }
    with_server(app) do |_server, port|
      wire = Wire.new(port)
      wire.write("GET / HTTP/1.0\r\n\r\n")
      wire.wait_for(/\r\n\r\nfirst\z/)
      arrived.push(1)
      wire.wait_for(/firstsecond\z/)
      arrived.push(2)
    ensure
      wire&.close
    end
  end

  # send_file(Rails.root.join(...)): to_path returns a Pathname.
  class PathnameBody
    def initialize(path)
      @path = Pathname.new(path)
    end

    def to_path
      @path
    end

    def each
      raise "each called: the Pathname was not sent with sendfile"
    end
  end

  def test_to_path_returning_a_pathname_takes_the_sendfile_path
    data = Random.new(7).bytes(300_000)
    Tempfile.create("serval-pathname") do |file|
      file.binmode
      file.write(data)
      file.flush
      app = ->(_env) { [200, { "content-type" => "application/octet-stream" }, PathnameBody.new(file.path)] }
      with_server(app) do |_server, port|
        raw = raw_request(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        head, body = raw.split("\r\n\r\n", 2)
        assert_match(/\r\ncontent-length: 300000\r\n/i, head)
        refute_match(/transfer-encoding/i, head)
        assert_equal data, body
      end
    end
  end
end
