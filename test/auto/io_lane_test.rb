# frozen_string_literal: true

require "test_helper"
require "support/http_wire"
require "serval/native_ext"

# The I/O lane (issue 10 item 2): requests measured idle in flight let the
# pool run extra threads up to max_io_threads, and the pool returns to
# max_threads when they end. Synchronized with Queues; deadlines only bound
# the waits.
class AutoIoLaneTest < Minitest::Test
  include Serval::HttpWire

  def setup
    skip "the I/O lane needs the GVL hook (Ruby 3.2+)" unless Serval::Native::GVL.supported?
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def wait_for(what, seconds: 10)
    deadline = now + seconds
    until (v = yield)
      flunk "timed out waiting for #{what}" if now > deadline
      sleep 0.02
    end
    v
  end

  # A body that sends a first chunk, then waits idle (no GVL) until released.
  class Stream
    def initialize(release)
      @release = release
    end

    def each
      yield "first\n"
      @release.pop
      yield "last\n"
    end
  end

  def app(started, release, inflight)
    lambda do |env|
      if env["PATH_INFO"] == "/stream"
        started << true
        [200, { "content-type" => "text/plain" }, Stream.new(release)]
      else
        inflight.enter
        x = 0
        20_000.times { |i| x += i } # a little CPU
        inflight.leave
        [200, { "content-type" => "text/plain" }, ["fast #{x}"]]
      end
    end
  end

  # Counts requests running at once in the app; remembers the most.
  class Inflight
    attr_reader :peak

    def initialize
      @mutex = Mutex.new
      @now = 0
      @peak = 0
    end

    def enter = @mutex.synchronize { @peak = [@peak, @now += 1].max }
    def leave = @mutex.synchronize { @now -= 1 }
    def reset = @mutex.synchronize { @peak = 0 }
  end

  def open_stream(port)
    c = connect(port, timeout: 10)
    c.write("GET /stream HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    c
  end

  def test_twenty_idle_streams_do_not_starve_fast_requests_and_capacity_returns
    started = Queue.new
    release = Queue.new
    inflight = Inflight.new
    with_server(app(started, release, inflight), min_threads: 0, max_threads: 4, max_io_threads: 20,
                                                 io_lane_idle: 0.05) do |server, port|
      streams = Array.new(20) { open_stream(port) }
      20.times { |i| wait_for("stream #{i + 1} of 20 to reach the app") { started.pop(timeout: 0.05) } }
      lane = server.stats[:io_lane]
      assert_operator lane[:lane_threads], :>=, 16, lane.inspect
      assert_operator server.stats[:running], :>, 4

      # GVL-bound requests are still served, one after another and at once
      10.times { assert_equal 200, http(port, get("/fast", { "Connection" => "close" })).status }
      fast = Array.new(4) do
        Thread.new { http(port, get("/fast", { "Connection" => "close" }), timeout: 10).status }
      end
      assert_equal [200] * 4, fast.map(&:value)

      20.times { release << true }
      streams.each do |s|
        r = s.read_response
        assert_equal 200, r.status
        assert_equal "first\nlast\n", r.body
        s.close
      end

      # capacity returns to max_threads, without more traffic
      wait_for("the pool to return to 4 threads") do
        s = server.stats
        s[:running] <= 4 && s[:io_lane][:lane_threads].zero? && s[:pool_capacity] == 4 - s[:busy_threads]
      end
      assert_equal 4, server.stats[:max_threads]

      # and stays there: 12 concurrent GVL-bound requests run at most 4 at a time
      inflight.reset
      Array.new(12) { Thread.new { http(port, get("/fast", { "Connection" => "close" }), timeout: 10).status } }
           .each { |t| assert_equal 200, t.value }
      assert_operator inflight.peak, :<=, 4
      assert_operator server.stats[:io_lane][:peak_lane_threads], :>=, 16
    end
  end

  def test_without_the_lane_four_threads_take_four_streams
    started = Queue.new
    release = Queue.new
    with_server(app(started, release, Inflight.new), min_threads: 0, max_threads: 4, max_io_threads: 0) do |server, port|
      streams = Array.new(6) { open_stream(port) }
      4.times { wait_for("stream") { started.pop(timeout: 0.05) } }
      assert_nil started.pop(timeout: 0.5), "a fifth stream got a thread with the lane off"
      assert_nil server.stats[:io_lane]
      6.times { release << true }
      2.times { wait_for("stream") { started.pop(timeout: 0.05) } }
      streams.each { |s| assert_equal 200, s.read_response.status }
      streams.each(&:close)
    end
  end

  def test_the_lane_is_bounded_by_max_io_threads
    started = Queue.new
    release = Queue.new
    with_server(app(started, release, Inflight.new), min_threads: 0, max_threads: 2, max_io_threads: 3,
                                                      io_lane_idle: 0.05) do |server, port|
      streams = Array.new(8) { open_stream(port) }
      5.times { wait_for("stream") { started.pop(timeout: 0.05) } } # 2 + 3
      assert_nil started.pop(timeout: 0.5), "more than max_threads + max_io_threads streams got a thread"
      assert_operator server.stats[:running], :<=, 5
      8.times { release << true }
      3.times { wait_for("stream") { started.pop(timeout: 0.05) } }
      streams.each { |s| assert_equal 200, s.read_response.status }
      streams.each(&:close)
    end
  end
end
