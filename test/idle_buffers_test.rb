# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"

# An idle keep-alive connection holds no output buffer (issue 12: an idle
# connection should cost a few KB): the buffers a request used are given
# back once the connection has been idle SV_IDLE_RELEASE_MS (50 ms, the
# loop's scan; with at most 256 connections open a busy connection keeps
# them from one request to the next, with more they go back at once),
# and the next request on the connection, or a pipelined one already read,
# is served as before.
class IdleBuffersTest < Minitest::Test
  include Serval::HttpWire

  CONNS = 20
  APP = ->(env) { [200, { "content-type" => "text/plain" }, ["hi #{env['PATH_INFO']}"]] }

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def stats_until(server, timeout: 5)
    deadline = now + timeout
    loop do
      s = server.stats
      return s if yield(s) || now > deadline

      sleep 0.01
    end
  end

  def get(client, path)
    client.write("GET #{path} HTTP/1.1\r\nHost: h\r\n\r\n")
    client.read_response
  end

  def test_idle_keep_alive_connections_hold_no_output_buffer
    clients = []
    with_server(APP, max_threads: 2) do |server, port|
      CONNS.times do |i|
        c = Client.new(port)
        clients << c
        res = get(c, "/#{i}")
        assert_equal 200, res.status
        assert_equal "hi /#{i}", res.body
      end
      s = stats_until(server) { |st| st[:output_buffered_bytes].zero? }
      assert_equal 0, s[:output_buffered_bytes], "#{CONNS} idle connections still hold output buffers"

      clients.each_with_index do |c, i|
        res = get(c, "/again#{i}")
        assert_equal "hi /again#{i}", res.body, "a connection whose buffers were freed serves its next request"
      end
    end
  ensure
    clients.each(&:close)
  end

  def test_pipelined_requests_survive_the_release
    with_server(APP, max_threads: 1) do |_server, port|
      c = Client.new(port)
      c.write("GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal ["hi /a", "hi /b", "hi /c"], Array.new(3) { c.read_response.body }
      assert_equal "hi /d", get(c, "/d").body
    ensure
      c&.close
    end
  end
end
