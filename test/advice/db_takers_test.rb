# frozen_string_literal: true

require_relative "../test_helper"
require "support/advice_windows"
require "serval/advice"

# The connection budget counts the threads beside the request threads that
# take connections (Action Cable's workers, load_async, Solid Queue in the
# server): DbPools reports them per pool as other_threads.
class DbTakersTest < Minitest::Test
  D = Serval::Advice::Database

  def test_budget_counts_other_threads
    db = D.call(threads: 5, processes: 2, machines: 3, extra_connections: 10, max_connections: 50, other_threads: 4)
    assert_equal [9, 5, 4, 18, 64], db.values_at(:per_process, :request_threads, :other_threads, :per_machine, :fleet)
    refute db[:fits]
    assert_equal 2, db[:max_machines] # (50 - 10) / 18
    assert_match(/\(5 request \+ 4 other threads in the process\)/, db[:warnings].first)
    plain = D.call(threads: 5, processes: 2, max_connections: 50)
    assert_equal [5, 0, 10], plain.values_at(:per_process, :other_threads, :per_machine)
    assert_empty plain[:warnings]
    assert_raises(ArgumentError) { D.call(threads: 5, processes: 1, other_threads: -1) }
  end

  def test_window_carries_other_threads_into_the_advice
    w = AdviceWindows.window(1500, db_pools: [{ name: "primary", size: 40, other_threads: 4 },
                                              { name: "cache", size: 40 }])
    r = Serval::Advice.recommend(w, machine: { cpus: 2.0 }, sim_requests: 2000, load_requests: 2000, sweep_max: 6,
                                    precision: false)
    assert_equal 4, r[:database][:other_threads]
    assert_equal r[:threads] + 4, r[:database][:per_process]
    pools = Serval::Advice::Window.new(w).pools
    assert_equal [4, 0], pools.map { |p| p[:other_threads] }
    bad = AdviceWindows.window(10, db_pools: [{ name: "primary", size: 4, other_threads: "many" }])
    assert_raises(ArgumentError) { Serval::Advice::Window.new(bad) }
    huge = AdviceWindows.window(10, db_pools: [{ name: "primary", size: 4, other_threads: 10**9 }])
    assert_equal 100_000, Serval::Advice::Window.new(huge).pools.first[:other_threads]
  end
end
