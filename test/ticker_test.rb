# frozen_string_literal: true

require "test_helper"
require "serval/ticker"

# The periodic thread behind the tuner, the I/O lane, the advice log, the
# balancer and tmp_restart.
class TickerTest < Minitest::Test
  class Log
    attr_reader :lines

    def initialize = @lines = Queue.new
    def exception(e, message) = @lines << "#{message}: #{e.message}"
  end

  def test_first_tick_runs_at_once_and_stop_wakes_a_long_sleep
    ran = Queue.new
    t = Serval::Ticker.new("serval-test", 3600, Log.new, first: :tick).start { ran << :tick }
    assert_equal :tick, ran.pop
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    t.stop(10)
    refute t.alive?, "stop woke the hour-long sleep"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    assert t.stopped?
    assert ran.empty?, "no tick after stop"
  end

  def test_first_wait_sleeps_an_interval_before_the_first_tick
    ran = Queue.new
    t = Serval::Ticker.new("serval-test", 3600, Log.new).start { ran << :tick }
    t.stop(10)
    refute t.alive?
    assert ran.empty?, "stopped during the first interval: never ran"
  end

  def test_it_ticks_every_interval
    ran = Queue.new
    t = Serval::Ticker.new("serval-test", 0.01, Log.new).start { ran << Thread.current.name }
    3.times { assert_equal "serval-test", ran.pop }
    t.stop(10)
    refute t.alive?
  end

  def test_ready_false_never_runs_and_priority_and_setup_apply
    ran = Queue.new
    t = Serval::Ticker.new("serval-test", 0.01, Log.new, first: :tick, ready: -> { ran << :asked; false }).start { ran << :tick }
    assert_equal :asked, ran.pop
    t.stop(10)
    assert ran.empty?
    seen = Queue.new
    t = Serval::Ticker.new("serval-test", 3600, Log.new, first: :tick, priority: -3,
                           setup: -> { seen << :setup }).start { seen << Thread.current.priority }
    assert_equal :setup, seen.pop
    assert_equal(-3, seen.pop)
    t.stop(10)
  end

  def test_on_error_keeps_it_going_without_it_the_error_ends_the_thread_logged
    errors = Queue.new
    ran = Queue.new
    n = 0
    t = Serval::Ticker.new("serval-test", 0.01, Log.new, first: :tick, on_error: ->(e) { errors << e.message })
                      .start { n += 1; ran << n; raise "tick #{n}" if n == 1 }
    assert_equal 1, ran.pop
    assert_equal "tick 1", errors.pop
    assert_equal 2, ran.pop, "went on after the error"
    t.stop(10)
    log = Log.new
    t = Serval::Ticker.new("serval-test", 0.01, log, first: :tick).start { raise "boom" }
    assert_match(/thread serval-test died: boom/, log.lines.pop)
    t.stop(10) # does not raise the dead thread's error again
    refute t.alive?
  end

  def test_stop_from_its_own_thread_does_not_join_itself
    done = Queue.new
    go = Queue.new
    t = Serval::Ticker.new("serval-test", 0.01, Log.new, first: :tick).start { go.pop; t.stop; done << :stopped }
    go << true
    assert_equal :stopped, done.pop
    assert t.stopped?
  end

  def test_bad_settings
    assert_raises(ArgumentError) { Serval::Ticker.new("x", 0, Log.new) }
    assert_raises(ArgumentError) { Serval::Ticker.new("x", 1, Log.new, first: :later) }
    assert_raises(ArgumentError) { Serval::Ticker.new("x", 1, Log.new).start }
  end
end
