# frozen_string_literal: true

require "test_helper"
require "support/subprocess_server"
require "io/nonblock"

# A listening socket handed over by systemd is in blocking mode (Ruby's own
# sockets are not). The event loop accepts until EAGAIN, so the core makes
# every listener non-blocking; before, the loop stopped in accept4 after the
# first connection and answered nothing until another one came.
class SocketActivationTest < Minitest::Test
  include Serval::SubprocessHelpers

  def test_a_blocking_listener_is_served
    listener = TCPServer.new("127.0.0.1", 0)
    listener.nonblock = false # as systemd passes it
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    require "serval/server"
    server = Serval::Server.new(Rack::Lint.new(app), Serval::Configuration::DEFAULTS,
                                log_writer: Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new))
    server.listen(listener)
    server.run
    port = listener.local_address.ip_port
    2.times do
      resp = raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", read_timeout: 3)
      assert_match %r{\AHTTP/1.1 200 OK\r\n}, resp, "the loop must not block in accept4"
    end
    assert listener.nonblock?
  ensure
    server&.stop(2)
    listener&.close
  end

  # The real thing: systemd-socket-activate (from the systemd package) holds
  # the port, execs serval with LISTEN_FDS=1 on the first connection, and
  # serval adopts fd 3 (docs/deployment.md "systemd").
  def test_systemd_socket_activate
    tool = %w[/usr/bin /bin /usr/local/bin].map { |d| File.join(d, "systemd-socket-activate") }
                                          .find { |f| File.executable?(f) }
    skip "systemd-socket-activate is not installed (apt-get install systemd)" unless tool
    port = Serval::SubprocessServer.free_port
    serval = spawn_server(command: [tool, "-l", "127.0.0.1:#{port}", RbConfig.ruby, "-w",
                                    Serval::SubprocessServer::EXE, "-b", "tcp://127.0.0.1:#{port}",
                                    "-w", "2", "config.ru"])
    serval.start
    serval.wait_for(/Listening on 127\.0\.0\.1:#{port} as 3\./, stream: :err) # the tool's own line
    3.times do |i|
      resp = raw_request(port, "GET /#{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", read_timeout: 15)
      assert_match %r{\AHTTP/1.1 200 OK\r\n.*hello\n\z}m, resp, serval.logs
    end
    serval.wait_for(/Adopted systemd fd 3 for tcp:\/\/127\.0\.0\.1:#{port}/)
  end

  require "rack"
  require "rack/lint"
end
