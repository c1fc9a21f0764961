# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"

# A process forked while a connection is open (Solid Queue's supervisor
# forked by its plugin, an app's system()) holds a copy of its descriptor:
# the server's close must still end the response for the client (a FIN),
# or a client reading until the close waits until that process exits.
class ForkCloseTest < Minitest::Test
  include Serval::SubprocessHelpers

  APP = <<~RUBY
    run lambda { |env|
      r, w = IO.pipe
      pid = fork { w.close; r.read; exit!(0) } # holds every inherited descriptor until the pipe closes
      r.close
      Process.detach(pid)
      $holders = [*$holders, w]
      [200, { "content-type" => "text/plain", "x-holder" => pid.to_s }, ["forked\\n"]]
    }
  RUBY

  def test_a_closed_connection_ends_while_a_forked_child_holds_its_descriptor
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1"], files: { "config.ru" => APP }).boot
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    response = raw_request(server.port, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", read_timeout: 5)
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert_match(/\AHTTP\/1\.1 200 .*forked\n\z/m, response)
    assert_operator elapsed, :<, 3, "the client waited for the forked child (#{elapsed.round(2)} s)"
  ensure
    server&.stop
  end
end
