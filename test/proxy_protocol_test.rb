# frozen_string_literal: true

require "test_helper"
require "fileutils"
require "support/subprocess_server"
require "support/real_proxies"

# The PROXY protocol with a real HAProxy (the Debian package) in front of a
# Serval subprocess configured with `set_remote_address proxy_protocol:
# :any`: `send-proxy` (v1, TCP mode) and `send-proxy-v2` (HTTP mode). The
# client connects to HAProxy from another loopback address (127.0.0.2,
# 127.0.0.3, ::1) than HAProxy's own connection to Serval (127.0.0.1), so
# REMOTE_ADDR shows which one the app saw. Skipped without haproxy.
class ProxyProtocolTest < Minitest::Test
  include Serval::RealProxies
  include Serval::SubprocessHelpers


  APP = <<~RUBY
    run lambda { |env| [200, { "content-type" => "text/plain" }, [env["REMOTE_ADDR"]]] }
  RUBY

  CONFIG = <<~RUBY
    bind "tcp://127.0.0.1:0"
    threads 1, 2
    set_remote_address proxy_protocol: :any
  RUBY

  HAPROXY = <<~CONF
    global
      maxconn 100
    defaults
      timeout connect 5s
      timeout client 30s
      timeout server 30s
    frontend v1
      mode tcp
      bind 127.0.0.1:%<v1>d
      %<v1_v6>s
      default_backend serval_v1
    backend serval_v1
      mode tcp
      server app 127.0.0.1:%<upstream>d send-proxy
    frontend v2
      mode http
      bind 127.0.0.1:%<v2>d
      %<v2_v6>s
      default_backend serval_v2
    backend serval_v2
      mode http
      server app 127.0.0.1:%<upstream>d send-proxy-v2
  CONF

  def setup
    @procs = []
  end

  def teardown
    @procs.each { |pid| stop_proxy(pid) }
  end

  def test_haproxy_send_proxy_v1_and_v2_give_the_client_address
    haproxy = tool("haproxy")
    serval = spawn_server(["-C", "serval.rb"], files: { "config.ru" => APP, "serval.rb" => CONFIG })
    serval.boot
    v6 = ipv6_loopback?
    v1 = Serval::SubprocessServer.free_port
    v2 = Serval::SubprocessServer.free_port
    conf = File.join(serval.dir, "haproxy.cfg")
    File.write(conf, format(HAPROXY, v1: v1, v2: v2, upstream: serval.port,
                                     v1_v6: v6 ? "bind [::1]:#{v1}" : "", v2_v6: v6 ? "bind [::1]:#{v2}" : ""))
    start_proxy([haproxy, "-f", conf, "-db"], v1, serval.dir)
    wait_listening(v2)

    assert_equal "127.0.0.2", get("127.0.0.1", v1, from: "127.0.0.2"), "send-proxy (v1)"
    assert_equal "127.0.0.3", get("127.0.0.1", v2, from: "127.0.0.3"), "send-proxy-v2"
    assert_equal "127.0.0.4", get("127.0.0.1", v2, from: "127.0.0.4", requests: 3), "keep-alive through v2"
    if v6
      assert_equal "::1", get("::1", v1, from: "::1"), "send-proxy (v1, TCP6)"
      assert_equal "::1", get("::1", v2, from: "::1"), "send-proxy-v2 (IPv6)"
    end

    # Serval itself refuses a client that bypasses the proxy
    direct = get_raw("127.0.0.1", serval.port, from: "127.0.0.1")
    assert_match %r{\AHTTP/1\.1 400 }, direct
    assert_includes direct, "no PROXY protocol header"
    serval.stop
  ensure
    serval&.cleanup(passed?)
  end

  private

  def ipv6_loopback?
    Socket.tcp_server_sockets("::1", 0).each(&:close)
    true
  rescue SystemCallError
    false
  end

  # REMOTE_ADDR the app answered (every answer of a keep-alive run the same).
  def get(host, port, from:, requests: 1)
    raw = get_raw(host, port, from: from, requests: requests)
    bodies = raw.split(%r{HTTP/1\.1 }).reject(&:empty?).map do |resp|
      assert_match(/\A200 /, resp)
      resp.split("\r\n\r\n", 2).last
    end
    assert_equal requests, bodies.size, raw
    assert_equal 1, bodies.uniq.size, raw
    bodies.first
  end

  def get_raw(host, port, from:, requests: 1)
    socket = Socket.tcp(host, port, from, 0, connect_timeout: 5)
    requests.times do |i|
      last = i == requests - 1
      socket.write("GET / HTTP/1.1\r\nHost: app.test\r\n#{last ? "Connection: close\r\n" : ''}\r\n")
      sleep 0.05 unless last # one request at a time through HAProxy
    end
    read_all(socket)
  ensure
    socket&.close
  end
end
