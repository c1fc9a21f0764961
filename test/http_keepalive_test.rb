# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# Persistent connections: sequential and pipelined requests, HTTP/1.0 rules,
# Connection: close, max_keepalive_requests, 100-continue, and errors in the
# middle of a pipeline.
class HTTPKeepaliveTest < Minitest::Test
  include Serval::HttpWire

  H = "Host: example.test\r\n"

  def with_ka_server(app: nil, **opts, &block)
    @calls = Queue.new
    with_server(app || recording_app(@calls), min_threads: 1, max_threads: 1, **opts, &block)
  end

  def sha(str)
    Digest::SHA256.hexdigest(str)
  end

  def paths
    drain_queue(@calls).map { |m, p, _| [m, p] }
  end

  def post(path, body, extra = "")
    "POST #{path} HTTP/1.1\r\n#{H}#{extra}Content-Length: #{body.bytesize}\r\n\r\n#{body}"
  end

  def assert_ok(resp, path, body = "")
    assert_equal "HTTP/1.1 200 OK", resp.status_line
    assert_equal "ok #{path} #{body.bytesize} #{sha(body)}", resp.body
  end

  def test_several_requests_on_one_connection
    with_ka_server do |server, port|
      client = connect(port)
      5.times do |i|
        client.write(good_request("/seq#{i}"))
        resp = client.read_response
        assert_ok(resp, "/seq#{i}")
        assert_nil resp.field("connection")
      end
      client.write(post("/seq-post", "payload"))
      assert_ok(client.read_response, "/seq-post", "payload")
      assert_equal (0..4).map { |i| ["GET", "/seq#{i}"] } + [%w[POST /seq-post]], paths
      assert_equal 1, server.stats[:accepted], "all on one connection"
      client.close
    end
  end

  def test_three_pipelined_requests_in_one_write_answered_in_order
    with_ka_server do |_server, port|
      client = connect(port)
      body = "pipelined body \r\n\r\nGET /not-a-request HTTP/1.1\r\n\r\n"
      client.write(good_request("/p1") + post("/p2", body) + good_request("/p3"))
      assert_ok(client.read_response, "/p1")
      assert_ok(client.read_response, "/p2", body)
      assert_ok(client.read_response, "/p3")
      assert client.silent_for?(0.1), "exactly three responses"
      assert_equal [%w[GET /p1], %w[POST /p2], %w[GET /p3]], paths
      client.close
    end
  end

  def test_pipelined_chunked_body_and_request_split_mid_head
    with_ka_server do |_server, port|
      client = connect(port)
      wire = "POST /c1 HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\n\r\n" \
             "#{post('/c2', 'xyz')}#{good_request('/c3')}"
      cut = wire.index("/c2") + 1
      client.write(wire[0, cut])
      assert_ok(client.read_response, "/c1", "abcdefg")
      client.write(wire[cut..])
      assert_ok(client.read_response, "/c2", "xyz")
      assert_ok(client.read_response, "/c3")
      client.close
    end
  end

  def test_large_unread_body_does_not_desynchronise_the_next_request
    seen = Queue.new
    app = lambda do |env|
      seen << env["PATH_INFO"] # never reads rack.input
      [200, { "content-type" => "text/plain" }, [env["PATH_INFO"]]]
    end
    with_ka_server(app: app, body_spill: 1024) do |_server, port|
      client = connect(port)
      body = "GET /smuggled HTTP/1.1\r\n#{H}\r\n" * 3000
      client.write(post("/big", body) + good_request("/after"))
      assert_equal "/big", client.read_response.body
      assert_equal "/after", client.read_response.body
      assert client.silent_for?(0.1)
      assert_equal %w[/big /after], drain_queue(seen)
      client.close
    end
  end

  def test_head_response_has_no_body_and_the_connection_stays_usable
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("HEAD /h HTTP/1.1\r\n#{H}\r\n#{good_request('/g')}")
      head = client.read_response(head_request: true)
      assert_equal "HTTP/1.1 200 OK", head.status_line
      assert_ok(client.read_response, "/g")
      client.close
    end
  end

  def test_http10_closes_by_default
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("GET /old HTTP/1.0\r\n\r\n#{good_request('/never')}")
      resp = client.read_response
      assert_ok(resp, "/old")
      refute_match(/keep-alive/i, resp.field("connection").to_s)
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /old]])
    end
  end

  def test_http10_keep_alive_when_asked
    with_ka_server do |server, port|
      client = connect(port)
      client.write("GET /k1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
      resp = client.read_response
      assert_ok(resp, "/k1")
      assert_equal "keep-alive", resp.field("connection")
      assert client.silent_for?(0.1), "connection stays open"
      client.write("GET /k2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
      assert_equal "keep-alive", client.read_response["connection"]
      client.write("GET /k3 HTTP/1.0\r\n\r\n")
      assert_ok(client.read_response, "/k3")
      assert_equal :eof, client.wait_close
      assert_equal [%w[GET /k1], %w[GET /k2], %w[GET /k3]], paths
      assert_equal 1, server.stats[:accepted]
      client.close
    end
  end

  def test_connection_close_is_honoured_and_later_pipelined_requests_are_dropped
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("GET /last HTTP/1.1\r\n#{H}Connection: close\r\n\r\n#{good_request('/dropped')}")
      resp = client.read_response
      assert_ok(resp, "/last")
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /last]])
    end
  end

  def test_connection_close_token_in_a_list
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("GET /list HTTP/1.1\r\n#{H}Connection: foo, Close\r\n\r\n")
      assert_equal "close", client.read_response["connection"]
      assert_equal :eof, client.wait_close
      client.close
    end
  end

  def test_framing_error_mid_pipeline_keeps_earlier_responses_and_stops_there
    with_ka_server do |_server, port|
      wire = good_request("/a") + post("/b", "bee") +
             "POST /bad HTTP/1.1\r\n#{H}Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd" +
             good_request("/c")
      client = connect(port)
      client.write(wire)
      assert_ok(client.read_response, "/a")
      assert_ok(client.read_response, "/b", "bee")
      resp = client.read_response
      assert_equal "HTTP/1.1 400 Bad Request", resp.status_line
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /a], %w[POST /b]])
    end
  end

  def test_framing_error_on_second_request_of_a_keepalive_connection
    with_ka_server do |_server, port|
      client = connect(port)
      client.write(good_request("/first"))
      assert_ok(client.read_response, "/first")
      client.write("GET /bad HTTP/1.1\r\n#{H}X-Bad\x00: 1\r\n\r\n#{good_request('/c')}")
      resp = client.read_response
      assert_equal "HTTP/1.1 400 Bad Request", resp.status_line
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /first]])
    end
  end

  def test_max_keepalive_requests_closes_after_n
    with_ka_server(max_keepalive_requests: 3) do |_server, port|
      client = connect(port)
      client.write(good_request("/1") + good_request("/2") + good_request("/3") + good_request("/4"))
      r1 = client.read_response
      r2 = client.read_response
      r3 = client.read_response
      [r1, r2, r3].each_with_index { |r, i| assert_ok(r, "/#{i + 1}") }
      assert_nil r1["connection"]
      assert_nil r2["connection"]
      assert_equal "close", r3["connection"]
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /1], %w[GET /2], %w[GET /3]])
    end
  end

  def test_expect_100_continue_before_the_body
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("POST /ex HTTP/1.1\r\n#{H}Expect: 100-continue\r\nContent-Length: 11\r\n\r\n")
      interim = client.read_response
      assert_equal "HTTP/1.1 100 Continue", interim.status_line
      assert_empty interim.headers
      assert_empty paths, "the app runs only once the body is there"
      client.write("hello world")
      resp = client.read_response
      assert_ok(resp, "/ex", "hello world")
      # the connection stays usable
      client.write(good_request("/next"))
      assert_ok(client.read_response, "/next")
      client.close
    end
  end

  def test_expect_100_continue_with_chunked_body
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("POST /exc HTTP/1.1\r\n#{H}Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n")
      assert_equal "HTTP/1.1 100 Continue", client.read_response.status_line
      client.write("5\r\nhello\r\n0\r\n\r\n")
      assert_ok(client.read_response, "/exc", "hello")
      client.close
    end
  end

  def test_no_100_continue_for_http10
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("POST /ex10 HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
      assert client.silent_for?(0.2), "HTTP/1.0 clients get no 1xx"
      client.write("hello")
      assert_ok(client.read_response, "/ex10", "hello")
      client.close
    end
  end

  def test_two_hundred_pipelined_requests_in_one_write
    with_ka_server do |server, port|
      client = connect(port)
      wire = (1..200).map { |i| i.even? ? post("/m#{i}", "b#{i}") : good_request("/m#{i}") }.join
      client.write(wire)
      (1..200).each do |i|
        assert_ok(client.read_response, "/m#{i}", i.even? ? "b#{i}" : "")
      end
      assert client.silent_for?(0.1)
      assert_equal 200, paths.size
      assert_equal 1, server.stats[:accepted]
      client.close
    end
  end

  def test_http10_post_with_keep_alive
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("POST /k HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc" \
                   "GET /k2 HTTP/1.0\r\n\r\n")
      assert_ok(client.read_response, "/k", "abc")
      assert_ok(client.read_response, "/k2")
      assert_equal :eof, client.wait_close
      client.close
    end
  end

  def test_stalled_second_request_on_a_keepalive_connection_gets_408
    with_ka_server(read_timeout: 0.3, persistent_timeout: 10) do |_server, port|
      client = connect(port)
      client.write(good_request("/ok"))
      assert_ok(client.read_response, "/ok")
      client.write("GET /stalled HTTP/1.1\r\n#{H}") # never finished
      resp = client.read_response
      assert_equal "HTTP/1.1 408 Request Timeout", resp.status_line
      assert_equal "close", resp.field("connection")
      assert_equal :eof, client.wait_close
      client.close
      assert_serves_fresh_request(port, @calls, prior: [%w[GET /ok]])
    end
  end

  def test_case_insensitive_framing_headers_on_a_kept_alive_connection
    with_ka_server do |_server, port|
      client = connect(port)
      client.write("POST /ci HTTP/1.1\r\nhOsT: example.test\r\ntransfer-encoding: CHUNKED\r\n\r\n" \
                   "3\r\nabc\r\n0\r\n\r\n" \
                   "POST /ci2 HTTP/1.1\r\n#{H}content-LENGTH: 2\r\n\r\nde")
      assert_ok(client.read_response, "/ci", "abc")
      assert_ok(client.read_response, "/ci2", "de")
      client.close
    end
  end
end
