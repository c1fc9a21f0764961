# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"

# Holding every connection slot with clients that trickle (or send nothing)
# must not stop service: at max_connections the loop closes the connections
# making the least progress so a fresh client is served, and a body must keep
# an average rate (min_body_rate) once read_timeout has passed.
class ConnectionExhaustionTest < Minitest::Test
  include Serval::HttpWire

  APP = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
  SLOTS = 8

  def wait_for_connections(server, count, timeout: 5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until server.stats[:connections] >= count
      flunk "only #{server.stats[:connections]} of #{count} connections open" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      Thread.pass
    end
  end

  # Every slot is taken by a client that sent part of a head (or nothing) and
  # would be allowed 30 s; a fresh client still gets its answer at once.
  def test_a_fresh_client_is_served_when_trickling_clients_hold_every_slot
    with_server(APP, max_connections: SLOTS, read_timeout: 30, first_data_timeout: 30) do |server, port|
      hogs = Array.new(SLOTS) do |i|
        connect(port).write(i.even? ? "GET / HT" : "G") # a partial head, or one byte
      end
      wait_for_connections(server, SLOTS)
      sleep 0.3 # older than SV_EVICT_MIN_AGE (0.25 s): a brand-new connection is never evicted
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      res = http(port, "GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout: 5)
      assert_equal 200, res.status
      assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
      closed = hogs.count { |c| %i[eof reset].include?(c.wait_close(timeout: 0)) }
      assert_operator closed, :>=, 1, "a slow client made room"
      assert_operator server.stats[:connections], :<=, SLOTS
    ensure
      hogs&.each(&:close)
    end
  end

  # Connections the app is working on are never evicted: with every slot
  # busy in the app, a new client waits (and is served once one finishes).
  def test_connections_in_the_app_are_not_evicted
    release = Queue.new
    started = Queue.new
    # the fresh request has its own gate: a thread that finished a busy
    # request may take the fresh one before the other busy one wakes, and
    # must not take that one's token
    fresh_gate = Queue.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/fresh"
        fresh_gate.pop
      else
        started << true
        release.pop
      end
      [200, { "content-type" => "text/plain" }, ["done"]]
    end
    with_server(app, max_connections: 2, max_threads: 2, min_threads: 2) do |server, port|
      busy = Array.new(2) do
        connect(port).write("GET /busy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
      end
      2.times { started.pop }
      sleep 0.3 # past SV_EVICT_MIN_AGE, so only the state protects them
      fresh = connect(port).write("GET /fresh HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
      assert fresh.silent_for?(0.5), "the fresh client was answered while both slots were in the app"
      2.times { release << true }
      busy.each { |c| assert_match(/done\z/, c.read_to_eof) }
      fresh_gate << true
      assert_match(%r{\AHTTP/1.1 200 OK}, fresh.read_to_eof)
    ensure
      busy&.each(&:close)
      fresh&.close
    end
  end

  # min_body_rate: after read_timeout of grace the body must average this
  # many bytes a second; a byte every 0.1 s (10 B/s) against 1000 B/s is cut
  # off with a 408 although no gap reaches read_timeout.
  def test_a_trickled_body_is_cut_off_by_min_body_rate
    with_server(APP, read_timeout: 0.5, min_body_rate: 1000) do |server, port|
      s = connect(port).write("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 8
      loop do
        break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        begin
          s.write("x")
        rescue SystemCallError, IOError
          break
        end
        got = s.read_more(0.1)
        next if got == :timeout
        break unless got == :data && !s.buffered.include?("\r\n\r\n")
      end
      assert_match(%r{\AHTTP/1.1 408 }, s.buffered)
      assert_equal 0, server.stats[:requests_count]
    ensure
      s&.close
    end
  end

  # The same trickle with min_body_rate 0 (off) is only bound by read_timeout
  # between bytes: still reading when the test stops.
  def test_min_body_rate_zero_turns_the_rate_check_off
    with_server(APP, read_timeout: 0.5, min_body_rate: 0) do |_server, port|
      s = connect(port).write("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
      20.times do
        s.write("x")
        assert s.silent_for?(0.1), "answered while the body was still arriving"
      end
    ensure
      s&.close
    end
  end
end
