# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require_relative "support/subprocess_server"
require_relative "support/cpu_rivals"

# ext/serval/gvl.c samples one in-request idle span in 16 and reads the
# thread's run-queue wait (Linux schedstat) at both ends: the part of the
# span in which the thread was ready but waited for a CPU. A real
# exe/serval pinned to one CPU (CpuRivals.cpu) serves requests that sleep forty times: alone
# on the CPU a woken thread runs at once; with three busy processes pinned
# to the same CPU it waits its turn (the server runs at nice 19, so that it
# does: cpu_rivals.rb). The margin checks that sharing
# registers (measured here: 0.4 % alone, 4.6-19 % shared, lower while other
# tests load the machine), not the scheduler's exact figures.
class CpuWaitTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire
  include Serval::CpuRivals

  APP = <<~RUBY
    run lambda { |env|
      if env["PATH_INFO"] == "/idle_wait"
        [200, { "content-type" => "text/plain" }, [Serval::Native::GVL.idle_wait.join(" ")]]
      else
        40.times { sleep 0.0005 }
        [200, { "content-type" => "text/plain" }, ["ok"]]
      end
    }
  RUBY

  def setup
    skip_unless_cpu_pinning
  end

  def get(port, path)
    http(port, good_request(path, host: "127.0.0.1"), timeout: 10)
  end

  # [wait, spanned, spans] of the sampled spans of n requests
  def serve(port, n)
    before = totals(port)
    n.times { assert_equal 200, get(port, "/").status }
    totals(port).zip(before).map { |a, b| a - b }
  end

  def totals(port) = get(port, "/idle_wait").body.split.map(&:to_f)

  def test_a_busy_cpu_shows_in_the_sampled_idle_spans
    server = spawn_server(command: pinned_serval("-t", "1", "config.ru", nice: 19), files: { "config.ru" => APP })
    server.start
    port = server.wait_for(/Listening on http:\/\/[^:]+:(\d+)/)[1].to_i
    alone = serve(port, 40)
    shared = nil
    with_rivals(3) { shared = serve(port, 40) }
    [alone, shared].each do |wait, spanned, spans|
      assert_operator spans, :>=, 20, "1 in 16 of 1,600 spans, at random: #{[alone, shared].inspect}"
      assert_operator wait, :<=, spanned, "a span's wait is part of it"
    end
    share = ->((wait, spanned, _)) { wait / spanned }
    assert_operator share.call(shared), :>=, (2 * share.call(alone)) + 0.02, "alone #{alone.inspect}, shared #{shared.inspect}"
  end
end
