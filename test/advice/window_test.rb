# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"

# What a merged (cluster) window and a fractional io_waits mean to the model.
class AdviceWindowTest < Minitest::Test
  def test_a_cluster_window_rate_is_per_process
    window = Serval::Advice::Window.new(requests: 1200, seconds: 60, processes: 2, samples: [{ run: 0.01, idle: 0.01 }])
    assert_in_delta 10.0, window.rate_per_process
    assert_in_delta 20.0, Serval::Advice::Window.new(requests: 1200, seconds: 60, samples: [{ run: 0.01, idle: 0.01 }])
                                                  .rate_per_process
    assert_nil Serval::Advice::Window.new(requests: 5, samples: [{ run: 0.01, idle: 0.01 }]).rate_per_process
  end

  # io_waits is a mean (the server counts idle periods per request): 1.5
  # gives requests of one and of two waits, half each, not a truncated 1.
  def test_fractional_io_waits_is_kept_as_a_mean
    window = Serval::Advice::Window.new(requests: 2, io_waits: 1.5, samples: [{ run: 0.01, idle: 0.01 }])
    assert_in_delta 1.5, window.io_waits
    workload = Serval::Advice::Workload.new(pairs: [[0.01, 0.01]], io_waits: 1.5)
    rng = Random.new(7)
    counts = Array.new(4000) { (workload.send(:segments, 0.01, 0.01, rng).size - 1) / 2 }
    assert_equal [1, 2], counts.uniq.sort
    assert_in_delta 1.5, counts.sum / counts.size.to_f, 0.05
  end
end
