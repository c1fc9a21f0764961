# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "tempfile"
require "time"

# What reaches the wire for each kind of Rack response, byte for byte where
# the framing matters; errors, callbacks and early hints.
class RackResponseTest < Minitest::Test
  include Serval::HttpWire

  TEXT = { "content-type" => "text/plain" }.freeze
  DATE = /\A(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT\z/

  # An enumerable body that is not an Array (no to_ary) and records close.
  class Each
    def initialize(chunks, closed = nil, raise_after: nil)
      @chunks = chunks
      @closed = closed
      @raise_after = raise_after
    end

    def each
      @chunks.each_with_index do |c, i|
        raise "boom in each" if @raise_after && i == @raise_after

        yield c
      end
    end

    def close
      @closed&.push(:closed)
    end
  end

  # A body served from a file: to_path, and each reading the same file.
  class FileBody
    attr_reader :each_called

    def initialize(path, closed = nil, slice: nil)
      @path = path
      @closed = closed
      @slice = slice
    end

    def to_path
      @path
    end

    def each
      @each_called = true
      data = File.binread(@path)
      yield(@slice ? data.byteslice(@slice) : data)
    end

    def close
      @closed&.push(:closed)
    end
  end

  def close_request(path = "/", method: "GET", version: "1.1", headers: "")
    host = version == "1.1" ? "Host: h\r\n" : ""
    "#{method} #{path} HTTP/#{version}\r\n#{host}#{headers}Connection: close\r\n\r\n"
  end

  def split_head(raw)
    head, body = raw.split("\r\n\r\n", 2)
    [head.split("\r\n"), body]
  end

  def test_array_body_gets_content_length_and_keep_alive
    app = ->(_env) { [200, TEXT.dup, ["hello", " ", "world"]] }
    with_server(app) do |_server, port|
      client = connect(port)
      2.times do
        client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal 200, res.status
        assert_equal "OK", res.reason
        assert_equal ["11"], res.values("content-length")
        assert_empty res.values("transfer-encoding")
        assert_empty res.values("connection"), "HTTP/1.1 keep-alive needs no connection header"
        assert_equal "hello world", res.body
      end
    end
  end

  def test_enumerable_body_on_http11_is_chunked_exactly
    app = ->(_env) { [200, TEXT.dup, Each.new(["hello", "", " world!"])] }
    with_server(app) do |_server, port|
      raw = raw_request(port, close_request)
      lines, body = split_head(raw)
      assert_equal "HTTP/1.1 200 OK", lines[0]
      assert_includes lines, "transfer-encoding: chunked"
      refute(lines.any? { |l| l.start_with?("content-length") })
      # the empty chunk is skipped, it would end the body early
      assert_equal "5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n", body
    end
  end

  def test_enumerable_body_on_http10_is_delimited_by_close
    app = ->(_env) { [200, TEXT.dup, Each.new(["hello", " world"])] }
    with_server(app) do |_server, port|
      raw = raw_request(port, "GET / HTTP/1.0\r\n\r\n")
      lines, body = split_head(raw)
      assert_equal "HTTP/1.1 200 OK", lines[0]
      refute(lines.any? { |l| l =~ /\A(transfer-encoding|content-length|connection: keep-alive)/i }, lines.inspect)
      assert_equal "hello world", body
    end
  end

  def test_enumerable_body_with_app_content_length_is_not_chunked
    app = ->(_env) { [200, { "content-length" => "11" }, Each.new(["hello", " world"])] }
    with_server(app) do |_server, port|
      client = connect(port)
      2.times do
        client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal ["11"], res.values("content-length")
        assert_empty res.values("transfer-encoding")
        assert_equal "hello world", res.body
      end
    end
  end

  def test_to_path_body_is_sent_from_the_file
    data = Random.new(3).bytes(1_500_000) # large enough to leave the worker thread
    Tempfile.create("serval-body") do |file|
      file.binmode
      file.write(data)
      file.flush
      closed = Queue.new
      bodies = Queue.new
      app = lambda do |_env|
        body = FileBody.new(file.path, closed)
        bodies << body
        [200, { "content-type" => "application/octet-stream" }, body]
      end
      with_server(app) do |_server, port|
        client = connect(port)
        2.times do
          client.write("GET /f HTTP/1.1\r\nHost: h\r\n\r\n")
          res = client.read_response
          assert_equal 200, res.status
          assert_equal [data.bytesize.to_s], res.values("content-length")
          assert_equal data.bytesize, res.body.bytesize
          assert res.body == data, "file bytes differ"
          assert_equal :closed, closed.pop
          refute bodies.pop.each_called, "a to_path body is sent from the file, not through each"
        end
      end
    end
  end

  # An app's content-length that differs from the file size (a Range
  # response) means the file is not the body: each is used.
  def test_to_path_with_a_different_content_length_falls_back_to_each
    Tempfile.create("serval-range") do |file|
      file.write("0123456789abcdef")
      file.flush
      app = lambda do |_env|
        [206, { "content-length" => "4", "content-range" => "bytes 2-5/16" }, FileBody.new(file.path, slice: 2...6)]
      end
      with_server(app) do |_server, port|
        res = http(port, close_request("/r"))
        assert_equal 206, res.status
        assert_equal "Partial Content", res.reason
        assert_equal ["4"], res.values("content-length")
        assert_equal "2345", res.body
      end
    end
  end

  def test_streaming_body_on_http11_and_http10
    body = lambda do |stream|
      stream.write("ab")
      stream << "cd"
      stream.close
    end
    app = ->(_env) { [200, TEXT.dup, body] }
    with_server(app) do |_server, port|
      lines, raw = split_head(raw_request(port, close_request("/s")))
      assert_equal "HTTP/1.1 200 OK", lines[0]
      assert_includes lines, "transfer-encoding: chunked"
      assert_equal "2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n", raw

      lines, raw = split_head(raw_request(port, "GET /s HTTP/1.0\r\n\r\n"))
      assert_equal "HTTP/1.1 200 OK", lines[0]
      assert_equal "abcd", raw
    end
  end

  def test_streaming_body_can_read_the_request_body
    body = ->(stream) { stream.write(stream.read.upcase) && stream.close }
    app = ->(_env) { [200, TEXT.dup, body] }
    with_server(app) do |_server, port|
      res = http(port, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
      assert_equal "HELLO", res.body
    end
  end

  def test_head_has_headers_but_no_body
    closed = Queue.new
    app = lambda do |env|
      body = env["PATH_INFO"] == "/each" ? Each.new(["hello"], closed) : ["hello"]
      [200, TEXT.dup, body]
    end
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response(head_request: true)
      assert_equal 200, res.status
      assert_equal ["5"], res.values("content-length")
      assert_equal ["text/plain"], res.values("content-type")
      client.write("HEAD /each HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response(head_request: true)
      assert_equal 200, res.status
      assert_equal :closed, closed.pop
      # the next response starts right where the HEAD responses ended
      client.write("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      res = client.read_response
      assert_equal "hello", res.body
      assert client.closed_by_peer?
      assert_empty client.buffered
    end
  end

  def test_204_and_304_have_no_body_and_no_content_length
    app = lambda do |env|
      env["PATH_INFO"] == "/204" ? [204, {}, []] : [304, { "etag" => '"x"' }, []]
    end
    with_server(app) do |_server, port|
      client = connect(port)
      %w[/204 /304].each do |path|
        client.write("GET #{path} HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal path[1..].to_i, res.status
        assert_empty res.values("content-length"), res.head
        assert_empty res.values("transfer-encoding"), res.head
      end
      client.write("GET /204 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_equal 204, client.read_response.status
      assert client.closed_by_peer?
      assert_empty client.buffered, "no body bytes after a 204/304"
    end
  end

  def test_date_header_is_present_in_imf_fixdate_format
    app = lambda do |env|
      headers = TEXT.dup
      headers["date"] = "Tue, 01 Jan 2030 00:00:00 GMT" if env["PATH_INFO"] == "/own"
      [200, headers, ["x"]]
    end
    with_server(app) do |_server, port|
      res = http(port, close_request)
      dates = res.values("date")
      assert_equal 1, dates.size
      assert_match DATE, dates[0]
      assert_in_delta Time.now.to_f, Time.httpdate(dates[0]).to_f, 5
      assert_equal ["Tue, 01 Jan 2030 00:00:00 GMT"], http(port, close_request("/own")).values("date")
    end
  end

  def test_array_header_values_are_sent_as_separate_lines
    app = ->(_env) { [200, { "set-cookie" => ["a=1", "b=2"], "x-one" => "1" }, ["x"]] }
    with_server(app) do |_server, port|
      res = http(port, close_request)
      assert_equal ["a=1", "b=2"], res.values("set-cookie")
      assert_equal ["1"], res.values("x-one")
    end
  end

  def test_connection_close_from_the_app_closes_the_connection
    app = ->(_env) { [200, { "connection" => "close" }, ["bye"]] }
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal ["close"], res.values("connection")
      assert_equal "bye", res.body
      assert client.closed_by_peer?
    end
  end

  # Lint would reject these responses itself; the server's own checks are tested.
  def test_invalid_response_headers_give_500_and_the_server_goes_on
    closed = Queue.new
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/cr" then [200, { "x-bad" => "a\rb" }, Each.new(["x"], closed)]
      when "/name" then [200, { "bad name" => "v" }, Each.new(["x"], closed)]
      when "/colon" then [200, { "bad:name" => "v" }, Each.new(["x"], closed)]
      when "/nul" then [200, { "x-bad" => "a\0b" }, Each.new(["x"], closed)]
      when "/status" then [42, {}, Each.new(["x"], closed)]
      else [200, TEXT.dup, ["fine"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      %w[/cr /name /colon /nul /status].each do |path|
        raw = raw_request(port, close_request(path))
        assert raw.start_with?("HTTP/1.1 500 Internal Server Error\r\n"), "#{path}: #{raw.inspect}"
        refute_includes raw, "x-bad"
        refute_includes raw, "bad name"
        assert_equal :closed, closed.pop, "#{path}: body.close"
        assert_equal "fine", http(port, close_request).body
      end
    end
  end

  # A bad field after good ones: the head written so far is taken back out
  # (request.c sv_head_rollback), so the 500 carries none of it, on keep-alive
  # too, whether the body is a plain Array (Request#respond) or not.
  def test_a_head_that_fails_midway_sends_nothing_of_itself
    app = lambda do |env|
      headers = { "x-good-first" => "1", "x-good-second" => "2", "x-bad" => "a\rb" }
      case env["PATH_INFO"]
      when "/array" then [200, headers, ["x"]]
      when "/each" then [200, headers, Each.new(["x"], Queue.new)]
      else [200, TEXT.dup, ["fine"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      %w[/array /each].each do |path|
        client.write("GET #{path} HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal 500, res.status, path
        assert_nil res["x-good-first"], path
        assert_nil res["x-good-second"], path
        client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert_equal "fine", client.read_response.body
      end
    end
  end

  def test_app_exception_gives_500_and_the_server_goes_on
    app = lambda do |env|
      raise ArgumentError, "app failed" if env["PATH_INFO"] == "/boom"

      [200, TEXT.dup, ["fine"]]
    end
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal 500, res.status
      assert_equal "Internal Server Error\n", res.body
      refute_includes res.body, "app failed", "no error details to the client"
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "fine", client.read_response.body
    end
    assert_includes @server_log_writer.stderr.string, "ArgumentError: app failed"
  end

  def test_lowlevel_error_handler_with_arity_1_2_and_3
    handlers = {
      1 => ->(e) { [503, { "content-type" => "text/plain" }, ["one #{e.message}"]] },
      2 => ->(e, env) { [502, {}, ["two #{e.message} #{env['PATH_INFO']}"]] },
      3 => ->(e, env, status) { [status + 1, {}, ["three #{e.message} #{env['PATH_INFO']} #{status}"]] }
    }
    expected = { 1 => [503, "one bad"], 2 => [502, "two bad /x"], 3 => [501, "three bad /x 500"] }
    app = ->(_env) { raise "bad" }
    handlers.each do |arity, handler|
      assert_equal arity, handler.arity
      with_server(app, lowlevel_error_handler: handler) do |_server, port|
        res = http(port, close_request("/x"))
        assert_equal expected[arity], [res.status, res.body], "arity #{arity}"
        assert_equal [res.body.bytesize.to_s], res.values("content-length")
      end
    end
  end

  def test_lowlevel_error_handler_that_raises_falls_back_to_the_default_500
    handler = ->(_e) { raise "handler broke" }
    with_server(->(_env) { raise "bad" }, lowlevel_error_handler: handler) do |_server, port|
      res = http(port, close_request)
      assert_equal 500, res.status
      assert_equal "Internal Server Error\n", res.body
    end
  end

  # Once the head is out, an error cannot become a 500: the connection is
  # closed, the client sees a truncated chunked body and never a second head.
  def test_exception_in_each_after_the_head_closes_the_connection
    closed = Queue.new
    app = lambda do |env|
      return [200, TEXT.dup, ["fine"]] if env["PATH_INFO"] == "/ok"

      [200, TEXT.dup, Each.new(["x" * 100_000, "part2", "never"], closed, raise_after: 2)]
    end
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      raw = client.read_to_eof # raises WireTimeout if the connection stays open
      assert_equal :closed, closed.pop
      refute_includes raw, "500"
      refute_includes raw, "never"
      refute raw.end_with?("0\r\n\r\n"), "the chunked body must not look complete"
      assert raw.empty? || raw.start_with?("HTTP/1.1 200 OK\r\n"), raw[0, 100].inspect
      assert_equal "fine", http(port, close_request("/ok")).body
    end
  end

  def test_body_close_is_called_for_every_kind_of_body
    closed = Queue.new
    Tempfile.create("serval-close") do |file|
      file.write("file")
      file.flush
      stream = Class.new do
        def initialize(closed) = @closed = closed
        def call(s) = s.write("streamed") && s.close
        def close = @closed << :closed
      end
      app = lambda do |env|
        case env["PATH_INFO"]
        when "/each" then [200, TEXT.dup, Each.new(["each"], closed)]
        when "/file" then [200, TEXT.dup, FileBody.new(file.path, closed)]
        when "/stream" then [200, TEXT.dup, stream.new(closed)]
        when "/raise" then [200, TEXT.dup, Each.new(%w[a b], closed, raise_after: 1)]
        end
      end
      with_server(app) do |_server, port|
        %w[/each /file /stream /raise].each do |path|
          raw_request(port, close_request(path))
          assert_equal :closed, closed.pop, path
        end
        raw_request(port, close_request("/each", method: "HEAD"))
        assert_equal :closed, closed.pop, "HEAD"
      end
    end
  end

  # Callbacks run after the response was written: each one blocks until the
  # test has read the whole response, so running them earlier would deadlock
  # (and the test would time out).
  def test_response_finished_and_after_reply_run_after_the_response_is_written
    read_it = Queue.new
    calls = Queue.new
    app = lambda do |env|
      env["rack.response_finished"] << lambda { |e, status, headers, error|
        calls << [:first_registered, e["PATH_INFO"], status, headers&.fetch("x-h", nil), error&.message]
      }
      env["rack.response_finished"] << lambda { |_e, _status, _headers, _error|
        read_it.pop
        calls << [:second_registered]
      }
      env["rack.after_reply"] << -> { calls << [:after_reply] }
      raise "late failure" if env["PATH_INFO"] == "/raise"

      [200, { "x-h" => "v" }, ["done"]]
    end
    with_server(app) do |_server, port|
      res = http(port, close_request("/cb"))
      assert_equal "done", res.body
      read_it << true
      assert_equal [:second_registered], calls.pop, "reverse order of registration"
      assert_equal [:first_registered, "/cb", 200, "v", nil], calls.pop
      assert_equal [:after_reply], calls.pop

      res = http(port, close_request("/raise"))
      assert_equal 500, res.status
      read_it << true
      assert_equal [:second_registered], calls.pop
      first = calls.pop
      assert_equal [:first_registered, "/raise"], first[0, 2]
      assert_equal "late failure", first[4]
      assert_equal [:after_reply], calls.pop
    end
  end

  def test_early_hints_are_sent_before_the_response
    app = lambda do |env|
      env["rack.early_hints"].call("link" => "</style.css>; rel=preload; as=style")
      [200, TEXT.dup, ["page"]]
    end
    with_server(app, early_hints: true) do |_server, port|
      client = connect(port)
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      hints = client.read_response
      assert_equal 103, hints.status
      assert hints.head.start_with?("HTTP/1.1 103 Early Hints\r\n"), hints.head
      assert_equal ["</style.css>; rel=preload; as=style"], hints.values("link")
      res = client.read_response
      assert_equal 200, res.status
      assert_equal "page", res.body
    end
  end

  def test_early_hints_key_is_absent_when_disabled
    seen = Queue.new
    app = lambda do |env|
      seen << env.key?("rack.early_hints")
      [200, TEXT.dup, ["page"]]
    end
    with_server(app, early_hints: false) do |_server, port|
      raw = raw_request(port, close_request)
      assert raw.start_with?("HTTP/1.1 200 OK\r\n"), raw
      assert_equal false, seen.pop
    end
  end

  def test_expect_100_continue
    app = ->(env) { [200, TEXT.dup, ["got #{env['rack.input'].read}"]] }
    with_server(app) do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
      assert_equal "HTTP/1.1 100 Continue\r\n\r\n", client.read_until("\r\n\r\n")
      client.write("hello")
      res = client.read_response
      assert_equal 200, res.status
      assert_equal "got hello", res.body
    end
  end

  def test_status_line_reasons
    app = ->(env) { [env["PATH_INFO"][1..].to_i, TEXT.dup, ["x"]] }
    with_server(app) do |_server, port|
      assert http(port, close_request("/404")).head.start_with?("HTTP/1.1 404 Not Found\r\n")
      assert_match %r{\AHTTP/1\.1 299 ?\r\n}, http(port, close_request("/299")).head
    end
  end

  # Rack requires String header values; Puma writes any value's to_s (nil:
  # empty) and apps rely on it (a Rails app setting a header from an unset
  # ENV variable): so does Serval, warning once per header name in
  # development (lib/serval/response_leniency.rb).
  def test_non_string_header_values_are_written_as_puma_writes_them
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/values"
        [200, { "x-lenient-nil" => nil, "x-lenient-int" => 5, "x-lenient-sym" => :abc,
                "x-lenient-arr" => ["a", nil, 3], "x-lenient-lines" => "a\nb\n", "x-lenient-empty" => "" }, ["ok"]]
      when "/each" then [200, { "x-lenient-nil" => nil }, Each.new(["o", "k"])]
      when "/length" then [200, { "content-length" => 2 }, Each.new(["ok"])]
      when "/nil-length" then [200, { "content-length" => nil }, ["ok"]]
      when "/symbol-name" then [200, { x_lenient_name: "v" }, ["ok"]]
      else [200, TEXT.dup, ["fine"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      client.write("GET /values HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal 200, res.status
      assert_includes res.head, "\r\nx-lenient-nil: \r\n"
      assert_equal [""], res.values("x-lenient-nil")
      assert_equal ["5"], res.values("x-lenient-int")
      assert_equal ["abc"], res.values("x-lenient-sym")
      assert_equal ["a", "", "3"], res.values("x-lenient-arr")
      assert_equal ["a", "b"], res.values("x-lenient-lines"), "split on LF; no empty line for the trailing one"
      assert_equal [""], res.values("x-lenient-empty")
      assert_equal "ok", res.body
      client.write("GET /each HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal [[""], "ok"], [res.values("x-lenient-nil"), res.body]
      client.write("GET /length HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal [["2"], "ok"], [res.values("content-length"), res.body]
      client.write("GET /nil-length HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal [["2"], "ok"], [res.values("content-length"), res.body], "a nil length: Serval's own"
      client.write("GET /symbol-name HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal ["v"], client.read_response.values("x_lenient_name")
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "fine", client.read_response.body, "the connection stays usable"
    end
    log = @server_log_writer.stderr.string
    %w[x-lenient-nil x-lenient-int x-lenient-sym x-lenient-arr].each do |name|
      assert_equal 1, log.scan(/response header "#{name}" has/).size, "one warning for #{name}:\n#{log}"
    end
    # once per process: another test of this process may have had it first
    assert_operator log.scan(/response header "content-length" has/).size, :<=, 1
    assert_equal 1, log.scan(/name :x_lenient_name is a Symbol/).size, log
    refute_match(/x-lenient-(lines|empty)/, log, "String values are not warned about")
    refute_match(/BadResponse/, log)
  end

  def test_the_lenient_values_warning_is_for_development_only
    app = ->(_env) { [200, { "x-lenient-prod" => nil }, ["ok"]] }
    before = ENV.fetch("RACK_ENV", nil)
    ENV["RACK_ENV"] = "production"
    with_server(app, lint: false) do |_server, port|
      assert_equal [""], http(port, close_request).values("x-lenient-prod")
    end
    refute_match(/x-lenient-prod/, @server_log_writer.stderr.string)
  ensure
    ENV["RACK_ENV"] = before
  end

  # A second content-length (names differing in case): the same length is
  # written once; two lengths are a 500 (a client or proxy could pick
  # either: the response would be framed two ways). None on a 204.
  def test_duplicate_content_length_headers
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/same" then [200, { "content-length" => "2", "Content-Length" => "2" }, ["ok"]]
      when "/differ" then [200, { "content-length" => "2", "Content-Length" => "3" }, ["ok"]]
      when "/204" then [204, { "content-length" => "0", "transfer-encoding" => "chunked" }, []]
      else [200, TEXT.dup, ["fine"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      client.write("GET /same HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal [["2"], "ok"], [res.values("content-length"), res.body]
      client.write("GET /differ HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal 500, client.read_response.status
      client.write("GET /204 HTTP/1.1\r\nHost: h\r\n\r\n")
      res = client.read_response
      assert_equal 204, res.status
      assert_empty res.values("content-length")
      assert_empty res.values("transfer-encoding")
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "fine", client.read_response.body
    end
    assert_match(/two content-length response headers that differ \(2 and 3\)/, @server_log_writer.stderr.string)
  end

  # The status as Puma reads it (to_i): "200" and 202.0 work; what is no
  # three-digit final status is a 500 (Puma would write "HTTP/1.1 0 CUSTOM").
  def test_status_given_as_a_string_or_an_integer_like_object
    to_i_only = Object.new
    def to_i_only.to_i = 203
    statuses = { "/string" => "201", "/spaced" => " 206", "/float" => 202.0, "/to-i" => to_i_only,
                 "/nil" => nil, "/word" => "abc", "/big" => 1000, "/info" => 100, "/symbol" => :ok }
    app = ->(env) { [statuses.fetch(env["PATH_INFO"], 200), {}, ["x"]] }
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      expected = { "/string" => 201, "/spaced" => 206, "/float" => 202, "/to-i" => 203,
                   "/nil" => 500, "/word" => 500, "/big" => 500, "/info" => 500, "/symbol" => 500 }
      expected.each do |path, status|
        client.write("GET #{path} HTTP/1.1\r\nHost: h\r\n\r\n")
        assert_equal status, client.read_response.status, path
      end
    end
    log = @server_log_writer.stderr.string
    assert_match(/invalid status nil/, log)
    assert_match(/invalid status "abc"/, log)
    assert_match(/status 100 is informational/, log)
  end

  # What Serval refuses (CR in a value: response splitting) is logged as one
  # line per response naming the cause, the first of each cause saying why.
  def test_a_refused_response_is_logged_once_per_occurrence_and_explained_once
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/split" then [200, { "x-refused-split" => "a\r\nset-cookie: evil=1" }, ["x"]]
      else [200, TEXT.dup, ["fine"]]
      end
    end
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      2.times do
        client.write("GET /split HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal 500, res.status
        refute_includes res.head, "evil"
      end
      client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "fine", client.read_response.body
    end
    lines = @server_log_writer.stderr.string.lines.grep(/x-refused-split/)
    assert_equal 2, lines.size, lines.join
    assert_match(/GET \/split: Serval::BadResponse: response header x-refused-split: control character 0x0d/, lines[0])
    assert_equal 1, lines.grep(/What Serval accepts in a response/).size, lines.join
  end
end
