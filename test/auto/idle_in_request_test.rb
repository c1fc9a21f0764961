# frozen_string_literal: true

require "test_helper"
require "support/http_wire"
require "serval/native_ext"

# Native::GVL.idle_in_request: the I/O lane's signal, from the GVL hook.
class AutoIdleInRequestTest < Minitest::Test
  include Serval::HttpWire

  def setup
    skip "needs the GVL hook (Ruby 3.2+)" unless Serval::Native::GVL.supported?
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def test_counts_idle_requests_not_busy_ones
    started = Queue.new
    release = Queue.new
    app = lambda do |env|
      started << env["PATH_INFO"]
      if env["PATH_INFO"] == "/idle"
        release.pop
      else
        x = 0
        x += 1 until release.pop(timeout: 0) # busy: holds or asks for the GVL all along
      end
      [200, {}, ["ok"]]
    end
    with_server(app, min_threads: 2, max_threads: 2) do |_server, port|
      gvl = Serval::Native::GVL
      assert_equal 0, gvl.idle_in_request(0)
      idle = connect(port, timeout: 10)
      idle.write(get("/idle", { "Connection" => "close" }))
      assert_equal "/idle", started.pop
      deadline = now + 5
      sleep 0.01 until gvl.idle_in_request(0.1) == 1 || now > deadline
      assert_equal 1, gvl.idle_in_request(0.1)
      assert_equal 0, gvl.idle_in_request(60), "not idle for a minute yet"

      busy = connect(port, timeout: 10)
      busy.write(get("/busy", { "Connection" => "close" }))
      assert_equal "/busy", started.pop
      t0 = now
      sleep 0.3
      # the busy request has been in flight 0.3 s and never idle: not counted
      assert_equal 1, gvl.idle_in_request(0.1) if now - t0 < 1
      2.times { release << true }
      assert_equal 200, idle.read_response.status
      assert_equal 200, busy.read_response.status
      idle.close
      busy.close
      assert_equal 0, gvl.idle_in_request(0)
    end
  end

  def test_rejects_a_negative_threshold
    assert_raises(ArgumentError) { Serval::Native::GVL.idle_in_request(-1) }
  end
end
