# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require_relative "support/subprocess_server"
require "tmpdir"
require "serval/systemd"

# Socket activation (LISTEN_FDS) and sd_notify, against a real serval process.
class SystemdTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  APP = <<~RU
    run ->(env) { [200, { "content-type" => "text/plain" }, ["listen_fds=\#{ENV['LISTEN_FDS'].inspect}\\n"]] }
  RU

  def setup
    @dir = Dir.mktmpdir("serval-sd-")
    @notify_path = File.join(@dir, "notify")
    @notify = Socket.new(:UNIX, :DGRAM, 0)
    @notify.bind(Socket.pack_sockaddr_un(@notify_path))
  end

  def teardown
    @notify&.close
    FileUtils.rm_rf(@dir)
  end

  # Runs serval through a wrapper that sets LISTEN_PID to the pid that execs
  # serval, with `socket` as fd 3, as systemd does.
  def spawn_activated(socket, args, env: {})
    wrapper = 'ENV["LISTEN_PID"] = Process.pid.to_s; exec(*ARGV, 3 => 3)'
    command = [RbConfig.ruby, "-e", wrapper, RbConfig.ruby, "-w", Serval::SubprocessServer::EXE, *args]
    env = { "LISTEN_FDS" => "1", "NOTIFY_SOCKET" => @notify_path }.merge(env)
    spawn_server(command: command, files: { "config.ru" => APP }, env: env, spawn_opts: { 3 => socket })
  end

  def next_message(timeout: 10)
    raise "no sd_notify message within #{timeout}s" unless @notify.wait_readable(timeout)

    @notify.recv(4096)
  end

  def messages_until(pattern, timeout: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    seen = []
    loop do
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      raise "no #{pattern.inspect} in #{seen.inspect}" if left <= 0

      seen << next_message(timeout: left)
      return seen if seen.last.match?(pattern)
    end
  end

  def get(port)
    http(port, good_request("/", host: "127.0.0.1")).body
  end

  def test_adopts_fd_3_matching_the_bind_and_notifies_ready_and_stopping
    socket = TCPServer.new("127.0.0.1", 0)
    port = socket.local_address.ip_port
    # The bind names the same address: binding it again would fail (EADDRINUSE),
    # so serving proves the socket was adopted.
    server = spawn_activated(socket, ["-b", "tcp://127.0.0.1:#{port}"]).boot
    socket.close
    assert_equal port, server.port
    server.wait_for(/Adopted systemd fd 3 for tcp:\/\/127\.0\.0\.1:#{port}/)
    assert_match(/\AREADY=1\nMAINPID=\d+\z/, next_message)
    assert_equal "listen_fds=nil\n", get(port) # the variables are gone for children
    server.signal("TERM")
    assert_equal "STOPPING=1", next_message
    assert server.wait(10)&.success?, server.logs
  end

  def test_cluster_mode_notifies_ready_once_workers_boot
    socket = TCPServer.new("127.0.0.1", 0)
    port = socket.local_address.ip_port
    server = spawn_activated(socket, ["-w", "2", "-t", "1:1", "-b", "tcp://127.0.0.1:#{port}"])
    server.start
    socket.close
    assert_match(/\AREADY=1\n/, messages_until(/READY=1/).last)
    assert_equal "listen_fds=nil\n", get(port) # a worker serves on the adopted socket
    server.signal("TERM")
    messages_until(/\ASTOPPING=1\z/)
    assert server.wait(15)&.success?, server.logs
  end

  # A hot restart is not a stop: systemd hears READY again from the new
  # program (same pid), never STOPPING (in both modes: Supervisor#begin_stop).
  def test_hot_restart_in_single_mode_notifies_ready_without_stopping
    server = spawn_server(["-b", "tcp://127.0.0.1:0"], env: { "NOTIFY_SOCKET" => @notify_path }).boot
    assert_match(/\AREADY=1\n/, next_message)
    server.signal("USR2")
    seen = messages_until(/\AREADY=1\n/)
    assert_equal [], seen.grep(/STOPPING/), seen.inspect
    server.wait_for(/- Restarting: exec/)
    server.signal("TERM")
    assert_equal "STOPPING=1", next_message
    assert server.wait(10)&.success?, server.logs
  end

  def test_unmatched_systemd_socket_is_an_extra_listener
    socket = TCPServer.new("127.0.0.1", 0)
    port = socket.local_address.ip_port
    server = spawn_activated(socket, ["-b", "tcp://127.0.0.1:0"]).boot
    socket.close
    server.wait_for(/Using systemd socket fd 3 \(http:\/\/127\.0\.0\.1:#{port}\), not named by any bind/)
    assert_equal "listen_fds=nil\n", get(port)
    assert_equal "listen_fds=nil\n", get(server.port)
  end

  # Puma's `bind_to_activated_sockets 'only'`: the passed socket serves,
  # the configured bind it does not match is not bound.
  def test_activated_sockets_only_leaves_unmatched_binds_unbound
    socket = TCPServer.new("127.0.0.1", 0)
    port = socket.local_address.ip_port
    spare = Serval::SubprocessServer.free_port
    config = "bind 'tcp://127.0.0.1:#{spare}'\nbind_to_activated_sockets 'only'\n"
    server = spawn_activated(socket, ["-C", "c.rb"])
    File.write(File.join(server.dir, "c.rb"), config)
    server.boot
    socket.close
    server.wait_for(/Not binding tcp:\/\/127\.0\.0\.1:#{spare}: bind_to_activated_sockets 'only'/)
    assert_equal "listen_fds=nil\n", get(port)
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", spare) }
    assert_equal 1, server.stdout.scan("* Listening on").size, server.logs
  end

  def test_listen_pid_of_another_process_is_ignored
    socket = TCPServer.new("127.0.0.1", 0)
    env = { "LISTEN_PID" => "1", "LISTEN_FDS" => "1", "NOTIFY_SOCKET" => @notify_path }
    server = spawn_server(["-b", "tcp://127.0.0.1:0"], env: env, spawn_opts: { 3 => socket }).boot
    socket.close
    refute_match(/systemd/, server.stdout)
  end

  def test_watchdog_pings_every_half_interval
    socket = TCPServer.new("127.0.0.1", 0)
    server = spawn_activated(socket, ["-b", "tcp://127.0.0.1:0"], env: { "WATCHDOG_USEC" => "200000" }).boot
    socket.close
    seen = messages_until(/\AWATCHDOG=1\z/)
    assert_match(/READY=1/, seen.first)
    messages_until(/\AWATCHDOG=1\z/, timeout: 2) # and again, 0.1 s later
    server.signal("TERM")
    messages_until(/\ASTOPPING=1\z/)
  end

  def test_notify_abstract_namespace
    name = "serval-test-#{Process.pid}-#{rand(1 << 30)}"
    listener = Socket.new(:UNIX, :DGRAM, 0)
    listener.bind(Socket.pack_sockaddr_un("\0#{name}"))
    assert Serval::Systemd.notify("STATUS=hi", { "NOTIFY_SOCKET" => "@#{name}" })
    assert listener.wait_readable(5)
    assert_equal "STATUS=hi", listener.recv(100)
  ensure
    listener&.close
  end

  def test_notify_without_socket_does_nothing
    refute Serval::Systemd.notify("READY=1", {})
    refute Serval::Systemd.notify("READY=1", { "NOTIFY_SOCKET" => File.join(@dir, "missing") })
  end

  def test_listen_fds_parsing_unsets_the_variables
    env = { "LISTEN_PID" => "42", "LISTEN_FDS" => "3", "LISTEN_FDNAMES" => "a:b:c" }
    assert_equal [3, 4, 5], Serval::Systemd.listen_fds(env, pid: 42)
    assert_empty env
    assert_empty Serval::Systemd.listen_fds({ "LISTEN_PID" => "41", "LISTEN_FDS" => "1" }, pid: 42)
    assert_empty Serval::Systemd.listen_fds({ "LISTEN_FDS" => "1" }, pid: 42)
  end

  def test_watchdog_interval
    assert_in_delta 0.5, Serval::Systemd.watchdog_interval({ "WATCHDOG_USEC" => "1000000" }, pid: 7)
    assert_nil Serval::Systemd.watchdog_interval({ "WATCHDOG_USEC" => "1000000", "WATCHDOG_PID" => "8" }, pid: 7)
    assert_nil Serval::Systemd.watchdog_interval({}, pid: 7)
  end
end
