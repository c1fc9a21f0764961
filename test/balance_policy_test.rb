# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "serval/cluster/load_table"
require "serval/cluster/balance_policy"
require "serval/load_meter"
require "serval/capacity"

# The pure parts of GVL-aware balancing and of the capacity signal: the
# policy, the shared load table, the meter, and what load balancers hear.
class BalancePolicyTest < Minitest::Test
  Policy = Serval::Cluster::BalancePolicy
  Entry = Serval::Cluster::LoadTable::Entry

  def sibling(index, util:, busy:, hold: false, stopping: false, max: 4)
    Entry.new(index: index, pid: 1000 + index, stamp: 1, hold: hold, shedding: false, stopping: stopping,
              util: util, busy: busy, max_threads: max, connections: 0, moved: 0)
  end

  def own(util, busy) = Policy::Own.new(util, busy)

  def test_a_saturated_worker_holds_while_a_sibling_has_headroom
    policy = Policy.new(interval: 1.0)
    d = policy.decide(own(0.97, 4.0), [sibling(1, util: 0.0, busy: 0.0)], 10.0)
    assert d.hold
    refute d.move, "a move waits until the imbalance has lasted an interval"
    assert_equal 1, d.target.index
  end

  def test_no_hold_below_saturation_or_without_a_sibling_with_headroom
    policy = Policy.new(interval: 1.0)
    refute policy.decide(own(0.6, 4.0), [sibling(1, util: 0.0, busy: 0.0)], 1.0).hold
    refute policy.decide(own(0.97, 4.0), [], 1.0).hold
    refute policy.decide(own(0.97, 4.0), [sibling(1, util: 0.95, busy: 1.0)], 1.0).hold, "sibling saturated"
    refute policy.decide(own(0.97, 4.0), [sibling(1, util: 0.1, busy: 1.0, hold: true)], 1.0).hold, "sibling holds"
    refute policy.decide(own(0.97, 4.0), [sibling(1, util: 0.1, busy: 1.0, stopping: true)], 1.0).hold, "sibling stops"
    refute policy.decide(own(0.97, 2.0), [sibling(1, util: 0.5, busy: 2.0)], 1.0).hold, "sibling runs as many"
  end

  # 4 keep-alive clients on one of two workers: one move per interval until
  # the difference is below GAP, then nothing more (no ping-pong).
  def test_moves_one_connection_per_interval_while_the_imbalance_lasts
    policy = Policy.new(interval: 1.0)
    idle = [sibling(1, util: 0.0, busy: 0.0)]
    moves = (0..10).map { |i| policy.decide(own(0.98, 4.0), idle, 100.0 + (i * 0.1)).move }
    assert_equal [false] * 10 + [true], moves
    refute policy.decide(own(0.98, 4.0), idle, 101.5).move, "the interval restarts after a move"
    assert policy.decide(own(0.98, 4.0), idle, 102.0).move
    # 3 against 1 (the sibling at 70 % GVL): still GAP apart, one more move
    assert policy.decide(own(0.99, 3.0), [sibling(1, util: 0.7, busy: 1.0)], 103.0).move
    # 2 against 2: balanced, the hold ends
    d = policy.decide(own(0.94, 2.0), [sibling(1, util: 0.94, busy: 2.0)], 104.0)
    refute d.hold
    refute d.move
    assert_equal 3, policy.moves
  end

  def test_a_hold_that_ends_restarts_the_wait
    policy = Policy.new(interval: 1.0)
    idle = [sibling(1, util: 0.0, busy: 0.0)]
    policy.decide(own(0.98, 4.0), idle, 0.0)
    refute policy.decide(own(0.5, 4.0), idle, 0.5).hold
    refute policy.decide(own(0.98, 4.0), idle, 1.2).move, "held for 0 s only"
    assert policy.decide(own(0.98, 4.0), idle, 2.2).move
  end

  # Four keep-alive clients 3 + 1 at 35 % CPU: the worker with three holds
  # the GVL ~81 % of the time, its sibling ~35 %: one moves (2 + 2 then
  # stays: same busy, and both below saturation, so neither holds).
  def test_three_clients_against_one_at_a_third_cpu_move_one
    policy = Policy.new(interval: 1.0)
    one = [sibling(1, util: 0.35, busy: 1.0)]
    assert policy.decide(own(0.81, 3.0), one, 0.0).hold
    refute policy.decide(own(0.81, 3.0), one, 0.5).move
    assert policy.decide(own(0.81, 3.0), one, 1.0).move
    even = [sibling(1, util: 0.62, busy: 2.0)]
    refute policy.decide(own(0.62, 2.0), even, 5.0).hold
    refute policy.decide(own(0.62, 2.0), even, 9.0).move
    refute policy.decide(own(0.7, 3.0), one, 10.0).hold, "below saturation: a 3 + 1 at less CPU is left alone"
  end

  def test_small_difference_holds_but_never_moves
    policy = Policy.new(interval: 0.5)
    list = [sibling(1, util: 0.7, busy: 2.0)]
    decisions = (0..20).map { |i| policy.decide(own(0.95, 3.0), list, i * 0.1) }
    assert decisions.all?(&:hold)
    assert decisions.none?(&:move)
  end

  def test_disabled_never_holds_nor_moves
    policy = Policy.new(interval: 0.2, enabled: false)
    decisions = (0..20).map { |i| policy.decide(own(1.0, 4.0), [sibling(1, util: 0.0, busy: 0.0)], i * 0.1) }
    assert decisions.none? { |d| d.hold || d.move }
  end

  def test_load_table_round_trip_between_processes
    Dir.mktmpdir do |dir|
      table = Serval::Cluster::LoadTable.create(dir)
      assert_empty Dir.children(dir), "the table's file is unlinked at once"
      pid = fork do
        table.write(1, pid: Process.pid, util: 0.5, busy: 2.5, max_threads: 4, connections: 3, moved: 7, hold: true)
        exit!(0)
      end
      Process.wait(pid)
      table.write(0, pid: Process.pid, util: 0.25, busy: 1.0, max_threads: 4, connections: 1, moved: 0, shedding: true)
      entries = table.read(max_age: 5)
      assert_equal [0, 1], entries.map(&:index)
      child = entries.last
      assert_equal [pid, 0.5, 2.5, 4, 3, 7, true, false, false],
                   [child.pid, child.util, child.busy, child.max_threads, child.connections, child.moved, child.hold,
                    child.shedding, child.stopping]
      assert entries.first.shedding
      assert_in_delta 0.375, child.headroom, 1e-9 # threads: (4 - 2.5) / 4 below GVL 0.5
    ensure
      table&.close
    end
  end

  def test_load_table_skips_torn_and_stale_slots
    Dir.mktmpdir do |dir|
      io = File.open(File.join(dir, "t"), "w+")
      table = Serval::Cluster::LoadTable.new(io)
      table.write(0, pid: 1, util: 0.1, busy: 0, max_threads: 1, connections: 0, moved: 0)
      table.write(1, pid: 2, util: 0.1, busy: 0, max_threads: 1, connections: 0, moved: 0)
      io.pwrite([12_345].pack("Q<"), Serval::Cluster::LoadTable::SLOT) # slot 1 half rewritten
      assert_equal [0], table.read.map(&:index)
      stale = Serval::Cluster::LoadTable.now_ns - 10_000_000_000
      io.pwrite([stale, 3, 0, 0.0, 0.0, 1, 0, 0, stale].pack(Serval::Cluster::LoadTable::FORMAT).ljust(64, "\0"), 2 * 64)
      assert_equal [0], table.read(max_age: 2).map(&:index)
      assert_equal [0, 2], table.read.map(&:index)
      assert_raises(ArgumentError) { table.write(-1, pid: 1, util: 0, busy: 0, max_threads: 1, connections: 0, moved: 0) }
    ensure
      table&.close
    end
  end

  def test_load_meter_over_its_window
    meter = Serval::LoadMeter.new(1.0)
    assert_equal [0.0, 0.0, 0], meter.figures
    (0..20).each { |i| meter.add(i * 0.1, i * 0.09, i < 10 ? 4 : 2, i >= 15 ? 3 : 0) }
    util, busy, shed = meter.figures
    assert_in_delta 0.9, util, 1e-9
    assert_in_delta 2.0, busy, 0.25 # the last second: 2 busy threads
    assert_equal 3, shed
    # from the timing total: 3 requests in the process for the last second
    exact = Serval::LoadMeter.new(1.0)
    (0..20).each { |i| exact.add(i * 0.1, 0.0, 0, 0, request_seconds: i * 0.3) }
    assert_in_delta 3.0, exact.figures[1], 1e-9
  end

  def test_capacity_states_lines_and_readiness
    busy = Serval::Capacity::Load.new(0.9, 1.0, 4, false)
    idle = Serval::Capacity::Load.new(0.1, 0.0, 4, false)
    cap = Serval::Capacity.new(state: :ready, entries: [busy, idle])
    assert_in_delta 0.5, cap.headroom, 1e-9
    assert_equal "up ready 50%\n", cap.agent_line
    assert_equal 200, cap.readiness.first
    full = Serval::Capacity.new(state: :ready, entries: [Serval::Capacity::Load.new(1.0, 4.0, 4, false)])
    assert_equal "up ready 1%\n", full.agent_line, "never 0 %: HAProxy takes 0 for DRAIN"
    assert_equal "up ready 100%\n", Serval::Capacity.new(state: :ready).agent_line
    { booting: "down #booting\n", stopping: "down #stopping\n", shedding: "up drain\n" }.each do |state, line|
      cap = Serval::Capacity.new(state: state, entries: [idle])
      assert_equal line, cap.agent_line
      status, body = cap.readiness
      assert_equal 503, status
      assert body.start_with?(state.to_s)
    end
    assert_raises(ArgumentError) { Serval::Capacity.new(state: :bogus) }
  end
end
