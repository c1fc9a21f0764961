# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# RFC 9112 framing: every malformed or ambiguous request is answered by the
# I/O core with the exact status, `connection: close`, and a close; the app
# never sees it, and the server keeps serving fresh connections.
class HTTPFramingTest < Minitest::Test
  include Serval::HttpWire

  H = "Host: example.test\r\n"
  BAD = "HTTP/1.1 400 Bad Request"
  NOT_IMPL = "HTTP/1.1 501 Not Implemented"
  VERSION = "HTTP/1.1 505 HTTP Version Not Supported"
  EXPECTATION = "HTTP/1.1 417 Expectation Failed"
  SMUGGLED = "GET /smuggled HTTP/1.1\r\n#{H}\r\n"

  # name => [request bytes, expected status line]
  CASES = {
    # Content-Length
    cl_and_te: ["POST / HTTP/1.1\r\n#{H}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", BAD],
    cl_duplicate_differing: ["POST / HTTP/1.1\r\n#{H}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", BAD],
    cl_list_differing: ["POST / HTTP/1.1\r\n#{H}Content-Length: 5, 6\r\n\r\nhello!", BAD],
    cl_non_numeric: ["POST / HTTP/1.1\r\n#{H}Content-Length: abc\r\n\r\n", BAD],
    cl_hex: ["POST / HTTP/1.1\r\n#{H}Content-Length: 0x5\r\n\r\nhello", BAD],
    cl_plus_sign: ["POST / HTTP/1.1\r\n#{H}Content-Length: +5\r\n\r\nhello", BAD],
    cl_minus_sign: ["POST / HTTP/1.1\r\n#{H}Content-Length: -5\r\n\r\nhello", BAD],
    cl_empty: ["POST / HTTP/1.1\r\n#{H}Content-Length:\r\n\r\n", BAD],
    cl_overflow: ["POST / HTTP/1.1\r\n#{H}Content-Length: 99999999999999999999999\r\n\r\n", BAD],
    cl_duplicate_equal: ["POST / HTTP/1.1\r\n#{H}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", BAD],
    cl_list_equal: ["POST / HTTP/1.1\r\n#{H}Content-Length: 5, 5\r\n\r\nhello", BAD],
    # chunk framing
    chunk_size_not_hex: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_size_empty: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_size_signed: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_size_too_many_digits: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n" \
                                 "00000000000000005\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_size_overflow: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nhello\r\n", BAD],
    chunk_ext_over_limit: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n" \
                           "5;#{'a' * 40}=#{'b' * 40}\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_ext_invalid: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n5;=x\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_data_longer_than_size: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", BAD],
    chunk_bare_lf: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", BAD],
    # field syntax
    obs_fold: ["GET / HTTP/1.1\r\n#{H}X-Folded: a\r\n b\r\n\r\n", BAD],
    obs_fold_tab: ["GET / HTTP/1.1\r\n#{H}X-Folded: a\r\n\tb\r\n\r\n", BAD],
    space_before_colon: ["GET / HTTP/1.1\r\n#{H}X-Test : 1\r\n\r\n", BAD],
    te_space_before_colon: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", BAD],
    tab_before_colon: ["GET / HTTP/1.1\r\n#{H}X-Test\t: 1\r\n\r\n", BAD],
    control_char_in_value: ["GET / HTTP/1.1\r\n#{H}X-Test: a\x01b\r\n\r\n", BAD],
    del_in_value: ["GET / HTTP/1.1\r\n#{H}X-Test: a\x7fb\r\n\r\n", BAD],
    nul_in_value: ["GET / HTTP/1.1\r\n#{H}X-Test: a\x00b\r\n\r\n", BAD],
    bare_cr_in_value: ["GET / HTTP/1.1\r\n#{H}X-Test: a\rb\r\n\r\n", BAD],
    control_char_in_name: ["GET / HTTP/1.1\r\n#{H}X-\x01Test: 1\r\n\r\n", BAD],
    empty_field_name: ["GET / HTTP/1.1\r\n#{H}: 1\r\n\r\n", BAD],
    missing_host_http11: ["GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", BAD],
    duplicate_host: ["GET / HTTP/1.1\r\n#{H}Host: other.test\r\n\r\n", BAD],
    invalid_host: ["GET / HTTP/1.1\r\nHost: exa mple\r\n\r\n", BAD],
    # line endings
    bare_lf_everywhere: ["GET / HTTP/1.1\n#{H.chomp("\r\n")}\n\n", BAD],
    bare_lf_request_line: ["GET / HTTP/1.1\n#{H}\r\n", BAD],
    bare_lf_in_headers: ["GET / HTTP/1.1\r\n#{H}X-Test: 1\n\r\n", BAD],
    bare_lf_end_of_head: ["GET / HTTP/1.1\r\n#{H}\n", BAD],
    # request line
    lowercase_version: ["GET / http/1.1\r\n#{H}\r\n", BAD],
    extra_space_after_method: ["GET  / HTTP/1.1\r\n#{H}\r\n", BAD],
    extra_space_after_target: ["GET /  HTTP/1.1\r\n#{H}\r\n", BAD],
    trailing_space: ["GET / HTTP/1.1 \r\n#{H}\r\n", BAD],
    leading_space: [" GET / HTTP/1.1\r\n#{H}\r\n", BAD],
    tab_separator: ["GET\t/ HTTP/1.1\r\n#{H}\r\n", BAD],
    bad_method_char: ["G(ET / HTTP/1.1\r\n#{H}\r\n", BAD],
    method_with_slash: ["GE/T / HTTP/1.1\r\n#{H}\r\n", BAD],
    missing_version: ["GET /\r\n#{H}\r\n", BAD],
    garbage_version: ["GET / HTTP/x.y\r\n#{H}\r\n", BAD],
    target_with_space_char: ["GET /a\x7fb HTTP/1.1\r\n#{H}\r\n", BAD],
    target_with_control_char: ["GET /a\x01b HTTP/1.1\r\n#{H}\r\n", BAD],
    target_only_fragment: ["GET #b HTTP/1.1\r\n#{H}\r\n", BAD],
    # versions
    http2: ["GET / HTTP/2.0\r\n#{H}\r\n", VERSION],
    http30: ["GET / HTTP/3.0\r\n#{H}\r\n", VERSION],
    http09_style: ["GET / HTTP/0.9\r\n#{H}\r\n", VERSION],
    # transfer codings
    te_unknown: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: gzip\r\n\r\n", NOT_IMPL],
    te_identity: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: identity\r\n\r\n", NOT_IMPL],
    te_gzip_then_chunked: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", NOT_IMPL],
    te_empty: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding:\r\n\r\n", BAD],
    te_empty_element: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    # expectations and methods
    expect_other: ["POST / HTTP/1.1\r\n#{H}Expect: 200-ok\r\nContent-Length: 2\r\n\r\nhi", EXPECTATION],
    expect_continue_with_params: ["POST / HTTP/1.1\r\n#{H}Expect: 100-continue; x=1\r\nContent-Length: 2\r\n\r\nhi",
                                  EXPECTATION],
    connect: ["CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n", NOT_IMPL],
    # smuggling: the trailing request must never reach the app
    smuggle_cl_te: ["POST / HTTP/1.1\r\n#{H}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n" \
                    "0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_te_cl: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" \
                    "5c\r\n#{SMUGGLED}\r\n0\r\n\r\n", BAD],
    smuggle_te_chunked_gzip: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_te_xchunked: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n#{SMUGGLED}", NOT_IMPL],
    smuggle_te_chunked_param: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked;x=1\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_te_http10: ["POST / HTTP/1.0\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_te_http10_with_cl: ["POST / HTTP/1.0\r\n#{H}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" \
                                "0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_double_chunked_list: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked, chunked\r\n\r\n" \
                                  "0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_double_chunked_fields: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n" \
                                    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_cl_duplicate: ["POST / HTTP/1.1\r\n#{H}Content-Length: 0\r\nContent-Length: #{SMUGGLED.bytesize}\r\n\r\n" \
                           "#{SMUGGLED}", BAD],
    smuggle_obs_fold_te: ["POST / HTTP/1.1\r\n#{H}X-Padding: a\r\n Transfer-Encoding: chunked\r\n" \
                          "Content-Length: 5\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_bare_lf_te: ["POST / HTTP/1.1\r\n#{H}X-Test: 1\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n#{SMUGGLED}", BAD],
    smuggle_chunk_size_lf: ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n" \
                            "0\n\r\n#{SMUGGLED}", BAD]
  }.freeze

  def with_framing_server(**opts, &block)
    @calls = Queue.new
    # one worker thread: the ready queue is FIFO, so a request the app could
    # have seen is processed before the fresh request that checks for it
    with_server(recording_app(@calls), min_threads: 1, max_threads: 1, max_chunk_ext: 32, **opts, &block)
  end

  CASES.each do |name, (bytes, status_line)|
    define_method("test_#{name}") do
      with_framing_server do |_server, port|
        resp = assert_rejected(port, @calls, bytes.b, status_line)
        refute_match(/smuggled/, resp.raw)
      end
    end
  end

  def test_every_case_is_checked_against_a_well_formed_twin
    # guard against the table passing for the wrong reason: the same server
    # accepts the neighbouring well-formed requests
    good = [
      "POST /a HTTP/1.1\r\n#{H}Content-Length: 5\r\n\r\nhello",
      "POST /b HTTP/1.1\r\n#{H}Content-Length:  5 \r\n\r\nhello",
      "POST /c HTTP/1.2\r\n#{H}Content-Length: 5\r\n\r\nhello",
      "POST /d HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n5;name=val;q=\"x y\"\r\nhello\r\n0\r\n\r\n",
      "POST /e HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0005\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
      "GET /f HTTP/1.1\r\n#{H}X-Test:  padded\t\r\n\r\n",
      "GET /g HTTP/1.0\r\n\r\n",
      "\r\nGET /h HTTP/1.1\r\n#{H}\r\n",
      "OPTIONS * HTTP/1.1\r\n#{H}\r\n",
      "GET http://example.test/i?x=1 HTTP/1.1\r\n#{H}\r\n",
      "POST /j HTTP/1.1\r\n#{H}Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"
    ]
    with_framing_server do |_server, port|
      good.each do |bytes|
        client = connect(port)
        client.write(bytes)
        resp = client.read_response
        resp = client.read_response if resp.status == 100
        assert_equal "HTTP/1.1 200 OK", resp.status_line, bytes.inspect
        client.close
      end
      paths = drain_queue(@calls).map { |_, p, body| [p, body] }
      assert_equal [["/a", "hello"], ["/b", "hello"], ["/c", "hello"], ["/d", "hello"], ["/e", "hello"],
                    ["/f", ""], ["/g", ""], ["/h", ""], ["*", ""], ["/i", ""], ["/j", "hello"]], paths
    end
  end

  # What browsers and Node put in a target unencoded is served, as nginx and
  # Puma do; a fragment is dropped before the app sees the target.
  def test_targets_browsers_send_reach_the_app
    seen = Queue.new
    app = lambda do |env|
      seen << env.values_at("PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_PROTOCOL")
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(app) do |_server, port|
      {
        "/a|b{c}^d`e?q=\"x\"<y>" => ["/a|b{c}^d`e", "q=\"x\"<y>", "/a|b{c}^d`e?q=\"x\"<y>"],
        "/caf\xC3\xA9?n=\xE2\x82\xAC" => ["/caf\xC3\xA9", "n=\xE2\x82\xAC", "/caf\xC3\xA9?n=\xE2\x82\xAC"],
        "/page?x=1#section-2" => ["/page", "x=1", "/page?x=1"],
        "/anchor#only" => ["/anchor", "", "/anchor"]
      }.each do |target, (path, query, uri)|
        client = connect(port)
        client.write("GET #{target} HTTP/1.1\r\n#{H}Connection: close\r\n\r\n".b)
        assert_equal "HTTP/1.1 200 OK", client.read_response.status_line, target.inspect
        client.close
        assert_equal [path.b, query.b, uri.b, "HTTP/1.1"], seen.pop.map { |v| v.to_s.b }, target.inspect
      end
    end
  end

  # RFC 9110 2.5: a higher minor version of HTTP/1 is answered as HTTP/1.1.
  def test_http12_is_served_as_http11
    with_framing_server do |_server, port|
      client = connect(port)
      client.write("GET /v HTTP/1.2\r\n#{H}\r\nGET /w HTTP/1.2\r\n#{H}Connection: close\r\n\r\n")
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line, "kept alive as 1.1"
      client.close
    end
  end

  # A TLS ClientHello (or any bytes that cannot start a request line) on a
  # plain port is answered 400 at once, not after read_timeout.
  def test_garbage_without_a_line_end_is_refused_at_once
    with_framing_server(read_timeout: 60, first_data_timeout: 60) do |_server, port|
      hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03].pack("C*") + Random.new(1).bytes(32)
      client = connect(port)
      client.write(hello)
      assert_equal BAD, client.read_response.status_line # Client's read deadline is far below 60 s
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls)
    end
  end

  def test_bad_request_after_good_one_on_same_connection
    with_framing_server do |_server, port|
      bytes = "GET /first HTTP/1.1\r\n#{H}\r\n" \
              "POST /bad HTTP/1.1\r\n#{H}Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" \
              "GET /never HTTP/1.1\r\n#{H}\r\n"
      assert_rejected(port, @calls, bytes, BAD, before: ["HTTP/1.1 200 OK"], prior: [["GET", "/first"]])
    end
  end

  def test_error_body_is_framed_and_mentions_reason
    with_framing_server do |_server, port|
      client = connect(port)
      client.write("POST / HTTP/1.1\r\n#{H}Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
      resp = client.read_response
      assert_equal BAD, resp.status_line
      assert_equal resp.body.bytesize, Integer(resp.field("content-length"))
      refute_nil resp.field("date")
      assert_equal :eof, client.wait_close
      client.close
    end
  end

  def test_bad_request_split_across_writes_byte_by_byte
    with_framing_server do |_server, port|
      client = connect(port)
      "GET / HTTP/1.1\r\n#{H}X-Bad : 1\r\n\r\n".each_char { |ch| client.write(ch) }
      resp = client.read_response
      assert_equal BAD, resp.status_line
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls)
    end
  end

  def test_many_bad_requests_in_parallel_do_not_disturb_the_server
    with_framing_server(max_threads: 2) do |_server, port|
      bad = CASES.values.map(&:first)
      results = Queue.new
      threads = bad.each_slice((bad.size / 4.0).ceil).map do |slice|
        Thread.new do
          slice.each do |bytes|
            client = connect(port)
            client.write(bytes.b)
            status = client.read_response.status
            results << [status, client.wait_close]
            client.close
          end
        end
      end
      threads.each(&:join)
      got = drain_queue(results)
      assert_equal bad.size, got.size
      got.each do |status, closed|
        assert_includes [400, 417, 501, 505], status
        assert_equal :eof, closed
      end
      assert_serves_fresh_request(port, @calls)
    end
  end

  # A chunked head that arrives with only part of a chunk-size line (the
  # first decode step sinks nothing into a body buffer that has no memory
  # yet), then the rest one write at a time: the app reads the whole body. Under rake
  # test:asan this once stopped at a memcpy to a NULL buffer (UBSan).
  def test_chunked_head_alone_then_its_chunks_one_by_one
    app = lambda do |env|
      body = env["rack.input"].read
      [200, { "content-type" => "text/plain" }, ["#{body.bytesize}:#{body}"]]
    end
    with_server(app) do |_server, port|
      client = connect(port).write("POST /c HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n5")
      sleep 0.05
      ["\r\nhello\r\n", "6\r\n world\r\n", "0\r\n\r\n"].each do |part|
        client.write(part)
        sleep 0.02
      end
      assert_equal "11:hello world", client.read_response.body
      client.close
    end
  end
end
