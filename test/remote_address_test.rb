# frozen_string_literal: true

require "test_helper"
require "ipaddr"
require "support/http_wire"
require "serval/dsl"

# set_remote_address (Puma's): REMOTE_ADDR from the socket, a fixed value, a
# request header, or the PROXY protocol header (v1 text, v2 binary) each
# connection must start with. In-process servers on port 0, raw sockets.
class RemoteAddressTest < Minitest::Test
  include Serval::HttpWire

  GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
  LIMITS = Serval::Native::Core::REMOTE_LIMITS
  V2_SIG = "\r\n\r\n\0\r\nQUIT\n".b

  def setup
    @calls = Queue.new
  end

  def app
    calls = @calls
    lambda do |env|
      calls << env["REMOTE_ADDR"]
      [200, { "content-type" => "text/plain" }, [env["REMOTE_ADDR"]]]
    end
  end

  def serve(remote, **opts, &block)
    with_server(app, min_threads: 1, max_threads: 1, remote_address: remote, **opts, &block)
  end

  # The REMOTE_ADDR the app saw for bytes sent on a new connection.
  def remote_for(port, bytes)
    client = connect(port).write(bytes)
    resp = client.read_response
    assert_equal 200, resp.status, resp.raw
    resp.body
  ensure
    client&.close
  end

  # PROXY v2: command 1 (PROXY) or 0 (LOCAL), family/protocol byte, body.
  def v2(cmd, fam, body)
    V2_SIG + [0x20 | cmd, fam, body.bytesize].pack("CCn") + body.b
  end

  def v2_tcp4(src, dst = "10.0.0.1", sport = 51_234, dport = 80, tlv: "")
    v2(1, 0x11, IPAddr.new(src).hton + IPAddr.new(dst).hton + [sport, dport].pack("nn") + tlv)
  end

  def v2_tcp6(src, dst = "2001:db8::1", sport = 51_234, dport = 80)
    v2(1, 0x21, IPAddr.new(src).hton + IPAddr.new(dst).hton + [sport, dport].pack("nn"))
  end

  # Answered 400 (or closed) at once, the app never called.
  def assert_refused(port, bytes, status: 400)
    client = connect(port).write(bytes)
    started = now
    resp = client.read_response
    assert_equal status, resp.status, resp.raw
    assert_equal "close", resp.field("connection")
    assert_operator now - started, :<, 2.0, "answered at once"
    assert_includes %i[eof reset], client.wait_close
    assert_empty @calls
    resp
  ensure
    client&.close
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # ---- socket, value, header ---------------------------------------------

  def test_socket_is_the_default
    serve(:socket) { |_s, port| assert_equal "127.0.0.1", remote_for(port, GET) }
  end

  def test_a_fixed_value_for_every_request
    serve({ value: "10.9.8.7" }) do |_s, port|
      assert_equal "10.9.8.7", remote_for(port, GET)
      assert_equal "10.9.8.7", remote_for(port, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.1.1.1\r\n\r\n")
    end
  end

  def test_header_first_element_else_the_socket
    serve({ header: "X-Forwarded-For" }) do |_s, port|
      client = connect(port)
      ask = lambda do |extra|
        client.write("GET / HTTP/1.1\r\nHost: x\r\n#{extra}\r\n")
        client.read_response.body
      end
      assert_equal "203.0.113.7", ask.call("X-Forwarded-For: 203.0.113.7, 10.0.0.1\r\n")
      assert_equal "2001:db8::7", ask.call("x-forwarded-for:  2001:db8::7 \r\n"), "any case, OWS trimmed"
      assert_equal "198.51.100.1", ask.call("X-Forwarded-For: 198.51.100.1 10.0.0.1\r\n")
      assert_equal "127.0.0.1", ask.call(""), "absent: the socket's, on the same keep-alive connection"
      assert_equal "127.0.0.1", ask.call("X-Forwarded-For: , 1.2.3.4\r\n"), "empty first element"
      assert_equal "192.0.2.1", ask.call("X-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\n"), "first line"
      assert_equal "127.0.0.1", ask.call("X-Real-IP: 192.0.2.9\r\n"), "another field"
    ensure
      client&.close
    end
  end

  # ---- PROXY v1 -------------------------------------------------------------

  def test_v1_tcp4_and_tcp6
    serve({ proxy_protocol: :v1 }) do |_s, port|
      assert_equal "203.0.113.7", remote_for(port, "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n#{GET}")
      assert_equal "2001:db8::7", remote_for(port, "PROXY TCP6 2001:db8::7 2001:db8::1 51234 80\r\n#{GET}")
      assert_equal "192.0.2.5", remote_for(port, "PROXY TCP6 ::ffff:192.0.2.5 ::1 1 80\r\n#{GET}"), "v4-mapped"
    end
  end

  def test_v1_holds_for_every_request_of_the_connection
    serve({ proxy_protocol: :v1 }) do |_s, port|
      client = connect(port).write("PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n")
      3.times do
        client.write(GET)
        assert_equal "203.0.113.7", client.read_response.body
      end
      # a second PROXY line later is a bad request, not a new address
      client.write("PROXY TCP4 198.51.100.1 10.0.0.1 1 80\r\n#{GET}")
      assert_equal 400, client.read_response.status
    ensure
      client&.close
    end
  end

  def test_v1_unknown_keeps_the_socket_address
    serve({ proxy_protocol: :v1 }) do |_s, port|
      assert_equal "127.0.0.1", remote_for(port, "PROXY UNKNOWN\r\n#{GET}")
      assert_equal "127.0.0.1", remote_for(port, "PROXY UNKNOWN ffff:f::1 ffff:f::2 1 2\r\n#{GET}")
    end
  end

  # ---- PROXY v2 -------------------------------------------------------------

  def test_v2_ipv4_ipv6_and_tlvs
    serve({ proxy_protocol: :v2 }) do |_s, port|
      assert_equal "198.51.100.9", remote_for(port, v2_tcp4("198.51.100.9") + GET)
      assert_equal "2001:db8:a::9", remote_for(port, v2_tcp6("2001:db8:a::9") + GET)
      assert_equal "192.0.2.5", remote_for(port, v2_tcp6("::ffff:192.0.2.5") + GET), "v4-mapped"
      tlv = [0x04, 4].pack("Cn") + "noop" + [0x05, 3].pack("Cn") + "abc" # NOOP and UNIQUE_ID
      assert_equal "198.51.100.10", remote_for(port, v2_tcp4("198.51.100.10", tlv: tlv) + GET)
    end
  end

  def test_v2_local_and_unspec_keep_the_socket_address
    serve({ proxy_protocol: :v2 }) do |_s, port|
      assert_equal "127.0.0.1", remote_for(port, v2(0, 0x00, "") + GET), "LOCAL (a proxy's health check)"
      assert_equal "127.0.0.1", remote_for(port, v2(0, 0x11, "\0" * 12) + GET), "LOCAL with addresses"
      assert_equal "127.0.0.1", remote_for(port, v2(1, 0x00, "") + GET), "PROXY UNSPEC"
      assert_equal "127.0.0.1", remote_for(port, v2(1, 0x31, "\0" * 216) + GET), "PROXY UNIX"
    end
  end

  def test_any_takes_both_versions
    serve({ proxy_protocol: :any }) do |_s, port|
      assert_equal "203.0.113.7", remote_for(port, "PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n#{GET}")
      assert_equal "198.51.100.9", remote_for(port, v2_tcp4("198.51.100.9") + GET)
    end
  end

  # ---- refused --------------------------------------------------------------

  def test_missing_header_is_answered_400_at_once
    serve({ proxy_protocol: :any }) do |_s, port|
      resp = assert_refused(port, GET)
      assert_includes resp.body, "no PROXY protocol header"
      assert_refused(port, "\x16\x03\x01\x02\x00\x01\x00".b) # a TLS ClientHello
    end
  end

  def test_the_other_version_is_refused
    serve({ proxy_protocol: :v1 }) { |_s, port| assert_refused(port, v2_tcp4("198.51.100.9") + GET) }
    serve({ proxy_protocol: :v2 }) { |_s, port| assert_refused(port, "PROXY TCP4 203.0.113.7 10.0.0.1 1 80\r\n#{GET}") }
  end

  def test_malformed_headers_are_refused
    serve({ proxy_protocol: :any }) do |_s, port|
      ["PROXY TCP4 203.0.113.7 10.0.0.1 51234\r\n#{GET}",         # a field short
       "PROXY TCP4 203.0.113.999 10.0.0.1 1 80\r\n#{GET}",        # not an address
       "PROXY TCP4 2001:db8::1 10.0.0.1 1 80\r\n#{GET}",          # the wrong family
       "PROXY TCP4 203.0.113.7 10.0.0.1 1 80\n#{GET}",            # bare LF
       "PROXY TCP9 203.0.113.7 10.0.0.1 1 80\r\n#{GET}",          # unknown protocol
       "PROXY TCP4 203.0.113.7 10.0.0.1 99999 80\r\n#{GET}",      # port
       v2(1, 0x11, "\0" * 8) + GET,                                # addresses cut short
       V2_SIG + [0x31, 0x11, 12].pack("CCn") + ("\0" * 12) + GET, # version 3
       V2_SIG + [0x21, 0x41, 12].pack("CCn") + ("\0" * 12) + GET] # family 4
        .each { |bytes| assert_refused(port, bytes) }
    end
  end

  def test_oversized_headers_are_refused_as_soon_as_known
    serve({ proxy_protocol: :any }, first_data_timeout: 30.0) do |_s, port|
      # v1: 107 bytes and no CRLF yet; nothing more is sent
      assert_refused(port, "PROXY UNKNOWN #{'x' * (LIMITS[:proxy_v1] - 14)}")
      # v2: the length field says more than the limit; only the 16 bytes are sent
      assert_refused(port, V2_SIG + [0x21, 0x11, LIMITS[:proxy_v2] - 15].pack("CCn"))
      # at the limits: served
      line = "PROXY UNKNOWN #{'x' * (LIMITS[:proxy_v1] - 16)}\r\n"
      assert_equal LIMITS[:proxy_v1], line.bytesize
      assert_equal "127.0.0.1", remote_for(port, line + GET)
      big = v2_tcp4("198.51.100.9", tlv: [0x04, LIMITS[:proxy_v2] - 28 - 3].pack("Cn") + ("z" * (LIMITS[:proxy_v2] - 31)))
      assert_equal LIMITS[:proxy_v2], big.bytesize
      assert_equal "198.51.100.9", remote_for(port, big + GET)
    end
  end

  # ---- arrival in pieces, and too slowly --------------------------------------

  def test_header_split_across_packets
    serve({ proxy_protocol: :any }) do |_s, port|
      [("PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n#{GET}"), v2_tcp6("2001:db8::42") + GET].each do |bytes|
        @calls.clear
        client = connect(port)
        # byte by byte through the header (each write its own segment:
        # TCP_NODELAY, and the server reads between them)
        header_len = bytes.index("GET")
        bytes.byteslice(0, header_len).each_char do |ch|
          client.write(ch)
          sleep 0.002
        end
        assert_empty @calls
        client.write(bytes.byteslice(header_len..))
        assert_equal bytes.start_with?("PROXY") ? "203.0.113.7" : "2001:db8::42", client.read_response.body
        client.close
      end
      # the header and the request's first bytes in one packet, the rest later
      client = connect(port).write("PROXY TCP4 203.0.113.8 10.0.0.1 1 80\r\nGET / HT")
      sleep 0.02
      client.write("TP/1.1\r\nHost: x\r\n\r\n")
      assert_equal "203.0.113.8", client.read_response.body
      client.close
    end
  end

  def test_slow_or_absent_header_is_closed_after_first_data_timeout
    serve({ proxy_protocol: :v1 }, first_data_timeout: 0.3, read_timeout: 30.0) do |_s, port|
      partial = connect(port).write("PROXY TCP4 203.0.1")
      silent = connect(port)
      started = now
      assert_equal :eof, partial.wait_close(timeout: 5), "closed without an answer (no request began)"
      assert_equal :eof, silent.wait_close(timeout: 5)
      assert_operator now - started, :<, 3.0
      assert_operator now - started, :>=, 0.25
      # the header's first byte does not give it read_timeout: still first_data_timeout
      trickle = connect(port)
      started = now
      "PROXY TCP4 203.0.113.7".each_char do |ch|
        trickle.write(ch)
        sleep 0.05
      rescue Errno::EPIPE, Errno::ECONNRESET
        break # closed meanwhile
      end
      assert_includes %i[eof reset], trickle.wait_close(timeout: 5)
      assert_operator now - started, :<, 3.0
      # after a whole header, the first request gets a first_data_timeout of its own
      after = connect(port).write("PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n")
      assert_equal :eof, after.wait_close(timeout: 5)
      assert_empty @calls
      [partial, silent, trickle, after].each(&:close)
    end
  end

  # ---- configuration ------------------------------------------------------------

  def dsl_value(*args, **kw)
    options = {}
    Serval::DSL.new(options, ->(_msg) {}).set_remote_address(*args, **kw)
    options[:remote_address]
  end

  def test_dsl_forms
    assert_equal :socket, dsl_value
    assert_equal({ value: "127.0.0.1" }, dsl_value(:localhost))
    assert_equal({ value: "10.0.0.7" }, dsl_value("10.0.0.7"))
    assert_equal({ header: "X-Real-IP" }, dsl_value(header: "X-Real-IP"))
    assert_equal({ proxy_protocol: :v1 }, dsl_value(proxy_protocol: :v1))
    assert_equal({ proxy_protocol: :v2 }, dsl_value(proxy_protocol: "V2"))
    assert_equal({ proxy_protocol: :any }, dsl_value({ proxy_protocol: :any }))
  end

  def test_dsl_errors_name_the_method
    [[:peer], [""], ["two words"], ["x" * (LIMITS[:value] + 1)], [{ header: "X_Real_IP" }], [{ header: "" }],
     [{ proxy_protocol: :v3 }], [{ header: "X-A", proxy_protocol: :v1 }], [{ bogus: 1 }], [42]].each do |args|
      err = assert_raises(Serval::ConfigError, args.inspect) { dsl_value(*args) }
      assert_match(/\Aset_remote_address: /, err.message)
    end
  end

  def test_configuration_key_and_tls_binds
    opts = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(remote_address: { proxy_protocol: :v1 }))
    assert_equal({ proxy_protocol: :v1 }, opts[:remote_address])
    assert_equal :socket, Serval::Configuration::DEFAULTS[:remote_address]
    err = assert_raises(Serval::ConfigError) do
      Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
                                     remote_address: { proxy_protocol: :v2 },
                                     binds: ["ssl://127.0.0.1:0?cert=a.pem&key=b.pem"]
                                   ))
    end
    assert_match(/proxy_protocol: is not supported on ssl:/, err.message)
  end

  def test_core_checks_its_options
    assert_raises(ArgumentError) { Serval::Native::Core.new(proxy_protocol: :v3) }
    assert_raises(ArgumentError) { Serval::Native::Core.new(proxy_protocol: :v1, remote_value: "1.2.3.4") }
    assert_raises(ArgumentError) { Serval::Native::Core.new(remote_value: "x" * (LIMITS[:value] + 1)) }
    assert_raises(ArgumentError) { Serval::Native::Core.new(remote_header: "X_A") }
  end
end
