# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# Request#respond (ext/serval/request.c): a plain Array body of Strings is
# written by one C call; every other body, and a response with a rack.hijack
# header, falls back to ResponseWriter with nothing written twice. Without
# Rack::Lint here (it wraps every body, so the fast path never runs under it).
# Also Request#env's fallback for a template without the per-request keys.
class RespondTest < Minitest::Test
  include Serval::HttpWire

  H = "Host: example.test\r\n"

  class ArraySub < Array; end

  def app
    lambda do |env|
      case env["PATH_INFO"]
      when "/chunks" then [200, { "content-type" => "text/plain" }, ["ab", "", "cde"]]
      when "/empty" then [200, {}, []]
      when "/nocontent" then [204, {}, []]
      when "/short" then [200, { "content-length" => "10" }, ["abc"]]
      when "/long" then [200, { "content-length" => "2" }, ["abcdef"]]
      when "/sub" then [200, {}, ArraySub["sub", "class"]]
      when "/notstring" then [200, {}, ["ok", 1]]
      when "/frozen" then [200, {}.freeze, ["frozen"].freeze]
      when "/lenient" then ["201", { "x-respond-nil" => nil, "x-respond-int" => 7, "content-length" => 2 }, ["ok"]]
      when "/refused" then [200, { "x-respond-first" => "1", "x-respond-cr" => "a\rb" }, ["no"]]
      else [200, {}, ["other #{env['PATH_INFO']}"]]
      end
    end
  end

  def get(path, method: "GET")
    "#{method} #{path} HTTP/1.1\r\n#{H}\r\n"
  end

  # Everything the server sends until it closes the connection (bounded).
  def read_to_close(client, timeout: 5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    out = +"".b
    loop do
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flunk "the server did not close within #{timeout} s; got #{out.inspect}" unless left.positive? && client.socket.wait_readable(left)
      chunk = client.socket.read_nonblock(65_536, exception: false)
      next if chunk == :wait_readable
      return out if chunk.nil?

      out << chunk
    end
  rescue Errno::ECONNRESET
    out
  end

  def with_client(app = self.app)
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      yield client, port
    ensure
      client&.close
    end
  end

  def test_array_bodies_on_one_keep_alive_connection
    with_client do |client|
      r = client.write(get("/chunks")).read_response
      assert_equal [200, "5", "abcde"], [r.status, r.field("content-length"), r.body]
      r = client.write(get("/empty")).read_response
      assert_equal [200, "0", ""], [r.status, r.field("content-length"), r.body]
      r = client.write(get("/frozen")).read_response
      assert_equal [200, "frozen"], [r.status, r.body]
      r = client.write(get("/sub")).read_response # an Array subclass: ResponseWriter
      assert_equal [200, "8", "subclass"], [r.status, r.field("content-length"), r.body]
      r = client.write(get("/chunks", method: "HEAD")).read_response(head_request: true)
      assert_equal [200, "5", ""], [r.status, r.field("content-length"), r.body]
      r = client.write(get("/nocontent")).read_response
      assert_equal [204, nil], [r.status, r.field("content-length")]
      assert_equal "other /after", client.write(get("/after")).read_response.body
    end
  end

  # The one-call path takes what sv_write_head writes leniently (nil, an Integer,
  # a String status, an Integer length) as ResponseWriter's path does, and a
  # refused head leaves nothing of itself before the 500.
  def test_lenient_and_refused_heads_through_respond
    with_client do |client|
      r = client.write(get("/lenient")).read_response
      assert_equal [201, [""], ["7"], ["2"], "ok"],
                   [r.status, r.headers.select { |k, _| k == "x-respond-nil" }.map(&:last), [r.field("x-respond-int")],
                    [r.field("content-length")], r.body]
      r = client.write(get("/refused")).read_response
      assert_equal [500, nil], [r.status, r.field("x-respond-first")]
      assert_equal "other /after", client.write(get("/after")).read_response.body
    end
  end

  def test_a_body_shorter_than_its_content_length_closes_the_connection
    with_client do |client|
      out = read_to_close(client.write(get("/short")))
      assert_includes out, "content-length: 10\r\n"
      assert out.end_with?("\r\n\r\nabc"), out
    end
  end

  def test_a_body_longer_than_its_content_length_is_cut_and_closes
    with_client do |client|
      out = read_to_close(client.write(get("/long")))
      assert out.end_with?("\r\n\r\nab"), out
    end
  end

  def test_a_chunk_that_is_not_a_string_is_a_500_from_the_fallback
    with_client do |client|
      r = client.write(get("/notstring")).read_response
      assert_equal 500, r.status
    end
  end

  def test_partial_hijack_with_an_array_body_goes_to_the_writer
    hijacker = lambda do |io|
      io.write("raw after head")
      io.close
    end
    hijack_app = ->(_env) { [200, { "rack.hijack" => hijacker, "x-by" => "app" }, []] }
    with_client(hijack_app) do |client|
      head, rest = read_to_close(client.write(get("/"))).split("\r\n\r\n", 2)
      assert_match(%r{\AHTTP/1.1 200 OK\r\n}, head)
      assert_includes head, "x-by: app"
      refute_match(/rack\.hijack/, head)
      assert_equal "raw after head", rest
    end
  end

  def test_env_without_the_keys_in_the_template_still_has_them
    seen = Queue.new
    probe = lambda do |env|
      request = env["rack.hijack"]
      other = request.env({ "rack.input" => nil }.freeze)
      seen << other
      [200, {}, ["ok"]]
    end
    with_client(probe) do |client|
      assert_equal "ok", client.write("GET /p?q=1 HTTP/1.1\r\nHost: h.test:81\r\nX-A: 1\r\nX-A: 2\r\n\r\n").read_response.body
      env = seen.pop
      assert_equal ["GET", "/p", "q=1", "/p?q=1", "HTTP/1.1", "h.test", "81", "127.0.0.1"],
                   env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_PROTOCOL",
                                 "SERVER_NAME", "SERVER_PORT", "REMOTE_ADDR")
      assert_equal "1, 2", env["HTTP_X_A"]
      assert_equal [[], []], env.values_at("rack.response_finished", "rack.after_reply")
      assert_respond_to env["rack.hijack"], :call
      refute env.frozen?
    end
  end
end
