# frozen_string_literal: true

require_relative "test_helper"
require "serval/events"

# Serval::Events: Puma's lifecycle events under both generations of names.
class EventsTest < Minitest::Test
  def setup
    @out = StringIO.new
    @err = StringIO.new
    @events = Serval::Events.new(Serval::LogWriter.new(stdout: @out, stderr: @err))
  end

  def test_new_and_old_names_register_the_same_event_in_order
    seen = []
    @events.after_booted { seen << :new }
    @events.on_booted { seen << :old }
    @events.register(:on_booted, -> { seen << :callable })
    @events.fire(:after_booted)
    assert_equal %i[new old callable], seen
    @events.on_restart { seen << :restart }
    @events.before_restart { seen << :restart2 }
    @events.fire_before_restart!
    @events.on_stopped { seen << :stopped }
    @events.fire(:on_stopped)
    assert_equal %i[new old callable restart restart2 stopped], seen
  end

  def test_fire_once_runs_hooks_only_the_first_time
    count = 0
    @events.after_stopped { count += 1 }
    @events.fire_once(:after_stopped)
    @events.fire_after_stopped!
    assert_equal 1, count
  end

  def test_a_failing_hook_is_logged_and_the_others_run
    seen = []
    @events.after_booted { raise "boom" }
    @events.after_booted { seen << :second }
    @events.fire(:after_booted)
    assert_equal [:second], seen
    assert_match(/after_booted hook failed: RuntimeError: boom/, @err.string)
  end

  def test_unknown_event_and_missing_block_are_refused
    assert_raises(ArgumentError) { @events.register(:before_lunch) { nil } }
    assert_raises(ArgumentError) { @events.register(:after_booted) }
    assert_raises(ArgumentError) { @events.register(:after_booted, -> {}) { nil } }
  end
end
