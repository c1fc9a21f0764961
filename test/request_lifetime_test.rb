# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "socket"
require "serval/serval_ext"

# A Native::Request that nobody finished or aborted is ended by the GC
# (request.c req_free, during the sweep on Ruby 3.3, where the struct lives in
# the object's own slot): its connection is closed, the client sees EOF, and
# the core keeps serving. The handler always ends its requests; this is the
# path of one that escaped it.
class RequestLifetimeTest < Minitest::Test
  def test_a_request_left_to_the_gc_closes_its_connection
    listener = TCPServer.new("127.0.0.1", 0)
    port = listener.addr[1]
    core = Serval::Native::Core.new({})
    core.listen(listener.fileno, "127.0.0.1", port)
    core.start
    client = Serval::HttpWire::Client.new(port).write("GET /left HTTP/1.1\r\nHost: t\r\n\r\n")
    taken = Queue.new
    Thread.new { taken << core.next(5).object_id }.join(10) # the Request is dropped with the thread
    refute_nil taken.pop
    closed = :timeout # nothing was answered: EOF (no byte) once the GC ended it
    100.times do
      GC.start(full_mark: true, immediate_sweep: true)
      break unless (closed = client.wait_close(timeout: 0.1)) == :timeout
    end
    closed = client.wait_close(timeout: 1) if closed == :timeout
    assert_equal :eof, closed, "the connection of the collected request is still open, or was answered"
    # the core still serves: a second connection's request is taken and answered
    other = Serval::HttpWire::Client.new(port).write("GET /next HTTP/1.1\r\nHost: t\r\n\r\n")
    request = core.next(5)
    env = request.env({}.freeze)
    assert_equal "/next", env["PATH_INFO"]
    assert request.respond(200, { "content-type" => "text/plain" }, ["ok"])
    request.finish
    assert_match(/\AHTTP\/1.1 200 OK\r\n.*\r\n\r\nok\z/m, other.read_response.raw)
  ensure
    client&.close
    other&.close
    core&.shutdown(1)
    listener&.close
  end
end
