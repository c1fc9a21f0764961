# frozen_string_literal: true

require "test_helper"
require "minitest/mock"
require "serval/auto/sampler"

# The sampler turns two reads of the running totals into one interval's
# Measurement; here the totals are given, not served.
class AutoSamplerTest < Minitest::Test
  S = Serval::Auto::Sampler
  BOUNDS = [0.001, 0.01, 0.1].freeze

  # [counts, sums, cpu, bounds, wall, timed] as Timing.aggregate gives them
  def totals(requests, stall:, lock:)
    metrics = 7
    counts = Array.new(metrics * (BOUNDS.size + 1), 0)
    counts[S::QUEUE * (BOUNDS.size + 1)] = requests
    counts[S::STALL * (BOUNDS.size + 1) + 1] = requests
    sums = Array.new(metrics, 0.0)
    sums[S::STALL] = stall
    sums[S::LOCK] = lock
    [counts, sums, 0.0, BOUNDS, requests * 0.02, requests]
  end

  def measure(lock_split:)
    reads = [totals(0, stall: 0.0, lock: 0.0), totals(100, stall: 0.4, lock: 1.2)]
    clock = [0.0, 5.0]
    Serval::Timing.stub(:aggregate, -> { reads.shift }) do
      Serval::Native::GVL.stub(:enabled?, true) do
        Serval::Native::GVL.stub(:lock_split?, lock_split) do
          Serval::Native::GVL.stub(:global, [2.5e9]) do
            S.new(clock: -> { clock.shift }).sample(threads: 4)
          end
        end
      end
    end
  end

  def test_lock_waits_are_read_where_they_are_told_from_io
    m = measure(lock_split: true)
    assert_equal 100, m.requests
    assert_in_delta 0.004, m.stall_mean, 1e-12
    assert_in_delta 0.012, m.lock_mean, 1e-12
    assert_in_delta 0.016, m.waiting, 1e-12
  end

  def test_without_the_split_there_is_no_lock_figure
    m = measure(lock_split: false)
    assert_nil m.lock_mean
    assert_in_delta 0.004, m.waiting, 1e-12
  end
end
