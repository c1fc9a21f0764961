# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "fcntl"
require "serval/binder"

class BinderTest < Minitest::Test
  def setup
    @binder = Serval::Binder.new(backlog: 16)
    @dir = Dir.mktmpdir("serval-bind-")
  end

  def teardown
    @binder.close
    FileUtils.rm_rf(@dir)
  end

  def test_parse_tcp_ipv4_ipv6_and_query
    bind = Serval::Binder.parse("tcp://127.0.0.1:9292?backlog=64")
    assert_equal ["127.0.0.1", 9292, 64], [bind.host, bind.port, bind.backlog]
    bind = Serval::Binder.parse("tcp://[::1]:0")
    assert_equal ["::1", 0], [bind.host, bind.port]
  end

  def test_parse_unix
    bind = Serval::Binder.parse("unix:///tmp/x.sock?mode=0660&backlog=8")
    assert_equal ["/tmp/x.sock", 0o660, 8], [bind.path, bind.mode, bind.backlog]
  end

  def test_parse_errors_name_the_bind
    {
      "http://x:1" => /bind http:\/\/x:1: expected tcp/,
      "tcp://127.0.0.1" => /missing port/,
      "tcp://127.0.0.1:70000" => /port must be|not a valid URI/,
      "tcp://127.0.0.1:80?backlog=x" => /backlog must be an integer/,
      "tcp://127.0.0.1:80?bogus=1" => /unknown parameter `bogus`/,
      "unix://" => /missing socket path/,
      "unix:///tmp/a?mode=999" => /mode must be octal/,
      "unix:///tmp/a?umask=77x" => /umask must be octal/,
      "tcp://127.0.0.1:80?a=1&b=2" => /unknown parameters `a`, `b`/,
      "ssl://0.0.0.0:443" => /missing cert=PATH/,
      "ssl://0.0.0.0:443?cert=/c.pem" => /missing key=PATH/,
      "ssl://0.0.0.0:443?cert=/c&key=/k&verify_mode=maybe" => /verify_mode must be none or peer/,
      "ssl://0.0.0.0:443?cert=/c&key=/k&verify_mode=peer" => /verify_mode=peer needs ca=PATH/,
      "ssl://0.0.0.0:443?cert=/c&key=/k&ciphers=x" => /unknown parameter `ciphers`/
    }.each do |uri, pattern|
      error = assert_raises(Serval::ConfigError, uri) { Serval::Binder.parse(uri) }
      assert_match pattern, error.message
      assert_includes error.message, "bind #{uri}"
    end
  end

  def test_tcp_port_zero_reports_real_port
    listeners = @binder.bind(["tcp://127.0.0.1:0?backlog=4"])
    io = listeners.first.io
    port = io.local_address.ip_port
    refute_equal 0, port
    assert_equal "http://127.0.0.1:#{port}", listeners.first.url
    assert_equal ["http://127.0.0.1:#{port}"], @binder.urls
    assert io.getsockopt(Socket::SOL_SOCKET, Socket::SO_REUSEADDR).bool
    assert_equal Fcntl::FD_CLOEXEC, io.fcntl(Fcntl::F_GETFD) & Fcntl::FD_CLOEXEC
    TCPSocket.new("127.0.0.1", port).close # accepts into the backlog
  end

  def test_tcp_ipv6
    begin
      TCPServer.new("::1", 0).close
    rescue SystemCallError
      skip "no IPv6 loopback here"
    end
    url = @binder.bind(["tcp://[::1]:0"]).first.url
    assert_match %r{\Ahttp://\[::1\]:\d+\z}, url
  end

  def test_address_in_use_is_config_error
    taken = TCPServer.new("127.0.0.1", 0)
    port = taken.local_address.ip_port
    error = assert_raises(Serval::ConfigError) { @binder.bind(["tcp://127.0.0.1:#{port}"]) }
    assert_equal "bind tcp://127.0.0.1:#{port}: address already in use", error.message
  ensure
    taken&.close
  end

  def test_failure_closes_earlier_listeners
    taken = TCPServer.new("127.0.0.1", 0)
    uris = ["tcp://127.0.0.1:0", "tcp://127.0.0.1:#{taken.local_address.ip_port}"]
    assert_raises(Serval::ConfigError) { @binder.bind(uris) }
    assert_empty @binder.listeners
  ensure
    taken&.close
  end

  def test_unix_socket_with_mode_and_cleanup
    path = File.join(@dir, "s.sock")
    listener = @binder.bind(["unix://#{path}?mode=0660"]).first
    assert_equal "unix://#{path}", listener.url
    assert File.socket?(path)
    assert_equal 0o660, File.stat(path).mode & 0o777
    UNIXSocket.new(path).close
    @binder.close
    refute File.exist?(path)
  end

  def test_stale_unix_socket_is_replaced
    path = File.join(@dir, "stale.sock")
    UNIXServer.new(path).close # leaves the file, nothing listens
    assert File.socket?(path)
    @binder.bind(["unix://#{path}"])
    UNIXSocket.new(path).close
  end

  def test_live_unix_socket_is_not_stolen
    path = File.join(@dir, "live.sock")
    live = UNIXServer.new(path)
    error = assert_raises(Serval::ConfigError) { @binder.bind(["unix://#{path}"]) }
    assert_match(/address already in use/, error.message)
    assert File.socket?(path)
  ensure
    live&.close
  end

  def test_regular_file_is_not_removed
    path = File.join(@dir, "file")
    File.write(path, "x")
    error = assert_raises(Serval::ConfigError) { @binder.bind(["unix://#{path}"]) }
    assert_match(/exists and is not a socket/, error.message)
    assert File.file?(path)
  end

  def test_parse_ssl
    bind = Serval::Binder.parse("ssl://127.0.0.1:9443?cert=/c.pem&key=/k.pem&backlog=32")
    assert_equal [:ssl, "127.0.0.1", 9443, 32], [bind.scheme, bind.host, bind.port, bind.backlog]
    assert_equal({ "cert" => "/c.pem", "key" => "/k.pem", "verify_mode" => "none" }, bind.tls)
  end

  def test_unix_socket_umask
    path = File.join(@dir, "u.sock")
    @binder.bind(["unix://#{path}?umask=0077"])
    assert_equal 0, File.stat(path).mode & 0o077 # no group/other bits from the socket's creation
    refute_equal 0o077, File.umask # restored
  end

  def test_unix_mode_wins_over_umask
    path = File.join(@dir, "m.sock")
    @binder.bind(["unix://#{path}?umask=0077&mode=0666"])
    assert_equal 0o666, File.stat(path).mode & 0o777
  end

  def test_tcp_ipv6_with_backlog
    begin
      TCPServer.new("::1", 0).close
    rescue SystemCallError
      skip "no IPv6 loopback here"
    end
    listener = @binder.bind(["tcp://[::1]:0?backlog=8"]).first
    assert_equal 8, listener.bind.backlog
    assert listener.io.local_address.ipv6?
    TCPSocket.new("::1", listener.io.local_address.ip_port).close
  end

  def test_hot_restart_inherits_sockets_by_url
    path = File.join(@dir, "r.sock")
    old = Serval::Binder.new(backlog: 16)
    old.bind(["tcp://127.0.0.1:0", "unix://#{path}"])
    env = old.inherit_env
    assert_match(/\A\d+=tcp:\/\/127\.0\.0\.1:0,\d+=unix:\/\/.*r\.sock\z/, env["SERVAL_INHERITED_FDS"])
    assert_equal old.ios.map(&:fileno).sort, old.inherit_redirects.keys.sort
    # the new process: same binds, inherited descriptors (dup'ed here)
    dups = old.ios.map { |io| io.fcntl(Fcntl::F_DUPFD, 50) }
    spec = env["SERVAL_INHERITED_FDS"].split(",").each_with_index.map { |e, i| "#{dups[i]}=#{e.split('=', 2)[1]}" }.join(",")
    new_env = { "SERVAL_INHERITED_FDS" => spec }
    log = StringIO.new
    binder = Serval::Binder.new(backlog: 16, env: new_env, log_writer: Serval::LogWriter.new(stdout: log, stderr: log))
    listeners = binder.bind(["tcp://127.0.0.1:0", "unix://#{path}"])
    assert_equal dups, listeners.map { |l| l.io.fileno }
    assert_equal old.urls, binder.urls
    assert_equal [:restart, :restart], listeners.map(&:inherited)
    assert_empty new_env
    assert_match(/Adopted restart fd #{dups[0]}/, log.string)
    old.close(unlink: false)
    UNIXSocket.new(path).close # still served by the inherited copy
    binder.close
    refute File.exist?(path)
  ensure
    old&.close
  end

  def test_inherited_socket_of_a_removed_bind_is_closed
    taken = TCPServer.new("127.0.0.1", 0)
    fd = taken.fcntl(Fcntl::F_DUPFD, 50)
    log = StringIO.new
    binder = Serval::Binder.new(env: { "SERVAL_INHERITED_FDS" => "#{fd}=tcp://127.0.0.1:1" },
                                log_writer: Serval::LogWriter.new(stdout: log, stderr: log))
    binder.bind(["tcp://127.0.0.1:0"])
    assert_match(/Closing inherited fd #{fd}/, log.string)
    assert_raises(Errno::EBADF) { IO.for_fd(fd, autoclose: false) }
    binder.close
  ensure
    taken&.close
  end

  def test_localhost_binds_loopback_on_one_port
    listeners = @binder.bind(["tcp://localhost:0"])
    ports = listeners.map { |l| l.io.local_address.ip_port }.uniq
    assert_equal 1, ports.size
    assert_includes @binder.urls, "http://127.0.0.1:#{ports.first}"
  end
end
