# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# Size limits, timeouts, body spilling and the connection cap, configured
# small through with_server options and driven over raw sockets.
class HTTPLimitsTest < Minitest::Test
  include Serval::HttpWire

  H = "Host: example.test\r\n"

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def with_limits_server(app: nil, **opts, &block)
    @calls = Queue.new
    with_server(app || recording_app(@calls), min_threads: 1, max_threads: 1, **opts, &block)
  end

  # status line, connection: close, EOF, app not called, fresh request served
  def assert_answered_and_closed(client, port, status_line, prior: [])
    resp = client.read_response
    assert_equal status_line, resp.status_line
    assert_equal "close", resp.field("connection")
    assert_equal :eof, client.wait_close
    client.close
    assert_serves_fresh_request(port, @calls, prior: prior)
    resp
  end

  def chunked(body, sizes)
    out = +"".b
    rest = body.b
    until rest.empty?
      n = [sizes.call, rest.bytesize].min
      out << n.to_s(16) << "\r\n" << rest.slice!(0, n) << "\r\n"
    end
    out << "0\r\n\r\n"
  end

  # ---- 414 ---------------------------------------------------------------

  def test_414_request_line_over_max_request_line
    with_limits_server(max_request_line: 128) do |_server, port|
      target = "/#{'a' * 200}"
      client = connect(port).write("GET #{target} HTTP/1.1\r\n#{H}\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 414 URI Too Long")
    end
  end

  def test_414_sent_before_the_request_line_ends
    with_limits_server(max_request_line: 128) do |_server, port|
      client = connect(port).write("GET /#{'a' * 300}") # no CRLF yet
      assert_answered_and_closed(client, port, "HTTP/1.1 414 URI Too Long")
    end
  end

  def test_request_line_at_the_limit_is_served
    with_limits_server(max_request_line: 128) do |_server, port|
      line = "GET /#{'a' * (128 - 'GET / HTTP/1.1'.bytesize)} HTTP/1.1"
      assert_equal 128, line.bytesize
      client = connect(port).write("#{line}\r\n#{H}\r\n")
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      client.close
      assert_equal 1, drain_queue(@calls).size
    end
  end

  # ---- 431 ---------------------------------------------------------------

  def test_431_head_over_max_head
    with_limits_server(max_head: 512) do |_server, port|
      client = connect(port).write("GET / HTTP/1.1\r\n#{H}X-Big: #{'b' * 1000}\r\n\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 431 Request Header Fields Too Large")
    end
  end

  def test_431_for_an_incomplete_head_over_max_head
    with_limits_server(max_head: 512) do |_server, port|
      client = connect(port).write("GET / HTTP/1.1\r\n#{H}#{"X-Pad: #{'p' * 50}\r\n" * 12}") # no blank line
      assert_answered_and_closed(client, port, "HTTP/1.1 431 Request Header Fields Too Large")
    end
  end

  def test_head_just_under_max_head_is_served
    with_limits_server(max_head: 512) do |_server, port|
      prefix = "GET / HTTP/1.1\r\n#{H}X-Big: "
      head = "#{prefix}#{'b' * (512 - prefix.bytesize - 4)}\r\n\r\n"
      assert_equal 512, head.bytesize
      client = connect(port).write(head)
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      client.close
      assert_equal 1, drain_queue(@calls).size
    end
  end

  def test_431_too_many_header_fields
    with_limits_server(max_headers: 4) do |_server, port|
      client = connect(port).write("GET / HTTP/1.1\r\n#{H}#{(1..4).map { |i| "X-H#{i}: #{i}\r\n" }.join}\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 431 Request Header Fields Too Large")
    end
  end

  def test_max_headers_fields_are_accepted
    with_limits_server(max_headers: 4) do |_server, port|
      client = connect(port).write("GET / HTTP/1.1\r\n#{H}#{(1..3).map { |i| "X-H#{i}: #{i}\r\n" }.join}\r\n")
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      client.close
      assert_equal 1, drain_queue(@calls).size
    end
  end

  def test_431_while_the_client_keeps_sending_an_endless_head
    with_limits_server(max_head: 1024) do |_server, port|
      client = connect(port)
      stop = Queue.new
      writer = Thread.new do
        client.write("GET / HTTP/1.1\r\n#{H}")
        line = "X-Pad: #{'p' * 1000}\r\n"
        sent = 0
        # 32 MiB: far more than the socket buffers, so the server must answer
        # while the head is still arriving rather than buffer it all
        while stop.empty? && sent < (32 << 20)
          client.socket.write(line)
          sent += line.bytesize
        end
        sent
      rescue Errno::EPIPE, Errno::ECONNRESET, IOError
        sent
      end
      resp = client.read_response
      stop << true
      assert_equal "HTTP/1.1 431 Request Header Fields Too Large", resp.status_line
      assert_equal "close", resp.field("connection")
      assert_operator writer.value, :<, 32 << 20, "the answer came only after the client gave up"
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls)
    end
  end

  # ---- 413 ---------------------------------------------------------------

  def test_413_content_length_over_max_body_answered_before_the_body
    with_limits_server(max_body: 100) do |_server, port|
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 101\r\n\r\n") # no body sent
      assert_answered_and_closed(client, port, "HTTP/1.1 413 Content Too Large")
    end
  end

  def test_413_with_expect_continue_sends_no_100
    with_limits_server(max_body: 100) do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n")
      resp = assert_answered_and_closed(client, port, "HTTP/1.1 413 Content Too Large")
      refute_match(/100 Continue/, resp.raw)
    end
  end

  def test_body_of_exactly_max_body_is_served
    with_limits_server(max_body: 100) do |_server, port|
      body = "x" * 100
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 100\r\n\r\n#{body}")
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok / 100 #{Digest::SHA256.hexdigest(body)}", resp.body
      client.close
    end
  end

  def test_413_chunked_body_growing_over_max_body
    with_limits_server(max_body: 100) do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n3c\r\n#{'a' * 60}\r\n")
      assert client.silent_for?(0.2), "60 bytes are within max_body; no answer yet"
      client.write("3c\r\n#{'b' * 60}\r\n0\r\n\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 413 Content Too Large")
    end
  end

  def test_413_single_huge_chunk_answered_before_it_is_all_sent
    with_limits_server(max_body: 100) do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n100000\r\n#{'c' * 150}")
      assert_answered_and_closed(client, port, "HTTP/1.1 413 Content Too Large")
    end
  end

  def test_chunked_body_of_exactly_max_body_is_served
    with_limits_server(max_body: 100) do |_server, port|
      body = "d" * 100
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n#{chunked(body, -> { 30 })}")
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok / 100 #{Digest::SHA256.hexdigest(body)}", resp.body
      client.close
    end
  end

  # The default has no limit, as Puma (docs/configuration.md "Request bodies"):
  # a 120 MB upload, over the old 100 MB default, reaches the app. It is
  # streamed from one reused 1 MiB buffer and the app counts it in 1 MiB reads,
  # so neither side builds it in memory; the server spills it to tmpdir.
  def test_body_over_the_old_100_mb_default_is_accepted_by_default
    assert_nil Serval::Configuration::DEFAULTS[:max_body]
    size = 120 << 20
    seen = Queue.new
    app = lambda do |env|
      input = env["rack.input"]
      buf = +""
      total = 0
      total += buf.bytesize while input.read(1 << 20, buf)
      seen << total
      [200, { "content-type" => "text/plain" }, ["got #{total}"]]
    end
    with_limits_server(app: app) do |_server, port|
      client = connect(port).write("POST /upload HTTP/1.1\r\n#{H}Content-Length: #{size}\r\n\r\n")
      block = "u".b * (1 << 20)
      120.times { client.write(block) }
      resp = client.read_response(timeout: 30)
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "got #{size}", resp.body
      assert_equal size, seen.pop
      client.close
    end
  end

  def test_explicit_max_body_still_answers_413_and_logs_it
    require "support/watched_io"
    err = Serval::WatchedIO.new
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: err)
    with_limits_server(max_body: 1000, log_writer: log) do |_server, port|
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 1001\r\n\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 413 Content Too Large")
      err.wait_for(/serval: error response 413 Content Too Large peer=127\.0\.0\.1 reason="request body too large"/)
    end
  end

  # ---- 408 and idle timeouts ----------------------------------------------

  def test_408_stalled_partial_head
    with_limits_server(read_timeout: 0.3) do |_server, port|
      client = connect(port).write("GET / HTTP/1.1\r\n#{H}") # head never finished
      started = now
      assert_answered_and_closed(client, port, "HTTP/1.1 408 Request Timeout")
      assert_operator now - started, :>=, 0.25
    end
  end

  def test_408_stalled_content_length_body
    with_limits_server(read_timeout: 0.3) do |_server, port|
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 10\r\n\r\nabc")
      assert_answered_and_closed(client, port, "HTTP/1.1 408 Request Timeout")
    end
  end

  def test_408_stalled_chunked_body
    with_limits_server(read_timeout: 0.3) do |_server, port|
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n5\r\nab")
      assert_answered_and_closed(client, port, "HTTP/1.1 408 Request Timeout")
    end
  end

  # read_timeout bounds the silence between bytes (the average rate is
  # min_body_rate's business, off here: test/connection_exhaustion_test.rb)
  def test_slow_but_steady_body_is_not_timed_out
    with_limits_server(read_timeout: 0.3, min_body_rate: 0) do |_server, port|
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 6\r\n\r\n")
      # each byte arrives within read_timeout of the previous one; the total
      # takes longer than read_timeout
      6.times do |i|
        assert client.silent_for?(0.1), "no answer (408) while bytes keep arriving"
        client.write(i.to_s)
      end
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok / 6 #{Digest::SHA256.hexdigest('012345')}", resp.body
      client.close
    end
  end

  def test_connection_without_data_closed_silently_after_first_data_timeout
    with_limits_server(first_data_timeout: 0.3) do |_server, port|
      client = connect(port)
      started = now
      assert_equal :eof, client.wait_close
      assert_operator now - started, :>=, 0.25
      assert_empty client.buffer, "nothing is answered to a connection that never spoke"
      client.close
      assert_serves_fresh_request(port, @calls)
    end
  end

  def test_idle_keepalive_connection_closed_silently_after_persistent_timeout
    with_limits_server(persistent_timeout: 0.3) do |_server, port|
      client = connect(port).write(good_request("/one"))
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_nil resp.field("connection"), "kept alive"
      started = now
      assert_equal :eof, client.wait_close
      assert_operator now - started, :>=, 0.25
      assert_empty client.buffer
      client.close
      assert_serves_fresh_request(port, @calls, prior: [["GET", "/one"]])
    end
  end

  # ---- body spill ---------------------------------------------------------

  def test_body_over_body_spill_arrives_intact
    with_limits_server(body_spill: 1024) do |_server, port|
      body = Random.new(1).bytes(200_000)
      client = connect(port).write("POST /up HTTP/1.1\r\n#{H}Content-Length: #{body.bytesize}\r\n\r\n")
      client.write(body)
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok /up 200000 #{Digest::SHA256.hexdigest(body)}", resp.body
      client.close
    end
  end

  def inspecting_app(seen)
    lambda do |env|
      input = env["rack.input"]
      data = input.read
      info = { class: input.class, size: data.bytesize, digest: Digest::SHA256.hexdigest(data) }
      if input.is_a?(File)
        info[:nlink] = input.stat.nlink
        info[:link] = File.readlink("/proc/self/fd/#{input.fileno}")
      end
      seen << info
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
  end

  def post_body(port, body)
    client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: #{body.bytesize}\r\n\r\n#{body}")
    assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
    client.close
  end

  def test_spilled_body_is_an_unlinked_temp_file
    seen = Queue.new
    with_limits_server(app: inspecting_app(seen), lint: false, body_spill: 1024) do |_server, port|
      body = Random.new(2).bytes(50_000)
      post_body(port, body)
      info = seen.pop
      assert_equal File, info[:class]
      assert_equal 50_000, info[:size]
      assert_equal Digest::SHA256.hexdigest(body), info[:digest]
      assert_equal 0, info[:nlink], "spill file must be unlinked (#{info[:link]})"
      assert_match(/\(deleted\)\z/, info[:link])
    end
  end

  def test_body_spill_threshold_is_exact
    seen = Queue.new
    with_limits_server(app: inspecting_app(seen), lint: false, body_spill: 1024) do |_server, port|
      post_body(port, "a" * 1024)
      assert_equal StringIO, seen.pop[:class], "a body of body_spill bytes stays in memory"
      # sent in two writes so the loop reads it in parts, not in place
      client = connect(port).write("POST / HTTP/1.1\r\n#{H}Content-Length: 1025\r\n\r\n")
      assert client.silent_for?(0.05)
      client.write("a" * 1025)
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      client.close
      info = seen.pop
      assert_equal File, info[:class], "a body over body_spill is spilled"
      assert_equal 1025, info[:size]
    end
  end

  def test_chunked_upload_with_random_chunk_sizes_spills_and_arrives_intact
    with_limits_server(body_spill: 4096) do |_server, port|
      rng = Random.new(3)
      body = rng.bytes(300_000)
      wire = chunked(body, -> { rng.rand(1..20_000) })
      client = connect(port).write("POST /chunks HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n")
      until wire.empty?
        client.write(wire.slice!(0, rng.rand(1..9000)))
      end
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok /chunks 300000 #{Digest::SHA256.hexdigest(body)}", resp.body
      client.close
    end
  end

  def test_chunked_upload_written_byte_by_byte
    with_limits_server do |_server, port|
      body = "The quick brown fox\r\njumps over 0\r\n\r\n the lazy dog"
      wire = "POST /bytes HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n" \
             "#{chunked(body, [3, 1, 7, 20, 2, 100].cycle.method(:next))}"
      client = connect(port)
      wire.each_char { |ch| client.write(ch) }
      resp = client.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_equal "ok /bytes #{body.bytesize} #{Digest::SHA256.hexdigest(body)}", resp.body
      client.close
    end
  end

  # ---- max_connections ----------------------------------------------------

  # At max_connections a new client is not left waiting behind idle
  # keep-alive connections: the one idle longest is closed to make room.
  def test_max_connections_makes_room_by_closing_the_longest_idle_connection
    with_limits_server(max_connections: 2, max_threads: 2) do |server, port|
      first = connect(port).write(good_request("/c1"))
      assert_equal "HTTP/1.1 200 OK", first.read_response.status_line
      second = connect(port).write(good_request("/c2"))
      assert_equal "HTTP/1.1 200 OK", second.read_response.status_line
      sleep 0.3 # both idle longer than SV_EVICT_MIN_AGE (0.25 s); first the longest
      third = connect(port).write(good_request("/c3"))
      resp = third.read_response
      assert_equal "HTTP/1.1 200 OK", resp.status_line
      assert_match(%r{\Aok /c3 }, resp.body)
      assert_equal 3, server.stats[:accepted]
      assert_equal :eof, first.wait_close, "the longest idle connection made room"
      second.write(good_request("/c2-again"))
      assert_equal "HTTP/1.1 200 OK", second.read_response.status_line
      [first, second, third].each(&:close)
    end
  end

  def test_431_chunked_trailer_section_over_max_head
    with_limits_server(max_head: 512) do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n" \
                   "X-Trailer: #{'t' * 1000}\r\n\r\n")
      assert_answered_and_closed(client, port, "HTTP/1.1 431 Request Header Fields Too Large")
    end
  end

  # A writer that has to wait for its client (no spill: max_spill 0) gives
  # up after write_timeout; with the spill the thread finishes at once and
  # the loop gives up after write_timeout instead. Either way the
  # connection is cut and the server serves the next client.
  def test_write_timeout_gives_up_on_a_client_that_does_not_read
    size = 32 << 20
    [[0, Serval::WriteTimeout], [nil, NilClass]].each do |max_spill, outcome|
      finished = Queue.new
      app = lambda do |env|
        env["rack.response_finished"] << ->(_env, _status, _headers, error) { finished << error }
        [200, { "content-type" => "application/octet-stream", "content-length" => size.to_s },
         Array.new(size / 65_536) { "z" * 65_536 }]
      end
      opts = { app: app, write_timeout: 0.3, output_buffer: 65_536, max_threads: 2 }
      opts[:max_spill] = max_spill if max_spill
      with_limits_server(**opts) do |server, port|
        client = connect(port)
        client.write(good_request("/huge"))
        error = finished.pop # the client reads nothing meanwhile
        assert_kind_of outcome, error, "max_spill #{max_spill.inspect}"
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
        sleep 0.01 until server.stats[:connections].zero? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        assert_equal 0, server.stats[:connections], "the loop cut the connection after write_timeout"
        got = 0
        begin
          while (chunk = client.socket.readpartial(1 << 20))
            got += chunk.bytesize
          end
        rescue EOFError, Errno::ECONNRESET
          nil
        end
        assert_operator got, :<, size, "the connection was cut, not completed"
        client.close
        fresh = connect(port).write(good_request("/after"))
        assert_equal "HTTP/1.1 200 OK", fresh.read_response.status_line
        fresh.close
      end
    end
  end

  def test_max_connections_slot_freed_when_the_server_closes_after_a_response
    with_limits_server(max_connections: 1) do |_server, port|
      3.times do |i|
        client = connect(port).write("GET /close#{i} HTTP/1.1\r\n#{H}Connection: close\r\n\r\n")
        resp = client.read_response
        assert_equal "HTTP/1.1 200 OK", resp.status_line
        assert_equal "close", resp.field("connection")
        assert_equal :eof, client.wait_close
        client.close
      end
      assert_equal [%w[GET /close0], %w[GET /close1], %w[GET /close2]], drain_queue(@calls).map { |m, p, _| [m, p] }
    end
  end
end
