# frozen_string_literal: true

require_relative "test_helper"
require "timeout"
require "support/http_wire"
require "serval/configuration"

# oob_gc N: a full GC once per N requests, run when the process is idle
# (Puma's out_of_band moment), counted in stats.
class OobGcTest < Minitest::Test
  include Serval::TestHelpers
  include Serval::HttpWire

  # A bounded Queue#pop (Queue#pop(timeout:) is Ruby 3.2+; on 3.1 the hash
  # reads as non_block and pops at once).
  def pop_within(queue, seconds)
    ::Timeout.timeout(seconds) { queue.pop }
  end

  APP = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }

  def test_runs_a_gc_once_per_n_requests_when_idle
    idle = Queue.new
    with_server(APP, oob_gc: 2, min_threads: 1, max_threads: 1, out_of_band: [-> { idle << GC.count }]) do |server, port|
      counts = Array.new(4) do
        assert_equal 200, http(port, get("/")).status
        pop_within(idle, 5) # the thread went idle and ran the out_of_band hooks (GC first)
      end
      assert_equal 2, server.stats[:oob_gc_runs]
      assert_operator counts[1], :>, counts[0], "a GC ran after the 2nd request"
      assert_operator counts[3], :>, counts[2], "and after the 4th"
    end
  end

  def test_off_by_default
    with_server(APP) do |server, port|
      assert_equal 200, http(port, get("/")).status
      refute server.stats.key?(:oob_gc_runs)
    end
  end

  def test_config_values
    assert_equal 1, config_from("oob_gc\n")[:oob_gc]
    assert_equal 50, config_from("oob_gc 50\n")[:oob_gc]
    assert_nil config_from("oob_gc false\n")[:oob_gc]
    assert_match(/oob_gc/, assert_raises(Serval::ConfigError) { config_from("oob_gc 0\n") }.message)
  end
end
