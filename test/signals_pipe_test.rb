# frozen_string_literal: true

require_relative "test_helper"
require "serval/signals"

# Serval::Signals: trap handlers write command names into the process's own
# self-pipe. A forked child runs the handlers it inherited until it installs
# its own; what they get stays in the child (Signals.early_push), never in
# the parent's pipe (a worker sent TERM as it booted used to stop the master).
class SignalsPipeTest < Minitest::Test
  def setup
    @signals = Serval::Signals.new.install("URG" => :stop)
  end

  def teardown
    @signals.close
  end

  def test_a_signal_is_read_back_as_its_command
    Process.kill(:URG, Process.pid)
    assert_equal [:stop], @signals.wait(5)
  end

  def test_a_worker_forked_keeps_what_its_inherited_handlers_get
    reader, writer = IO.pipe
    pid = Serval::Signals.forking_worker { fork do
      reader.close
      @signals.detach
      Process.kill(:URG, Process.pid) # handled before or after the child's own install: either way its own
      mine = Serval::Signals.new.install("URG" => :stop)
      mine.replay_early([:stop])
      writer.write(mine.wait(5).inspect)
      writer.close
      exit!(0)
    end }
    writer.close
    assert_equal "[:stop]", reader.read, "the child got its own stop"
    Process.wait(pid)
    assert_equal [], @signals.wait(0.2), "nothing reached the parent's pipe"
  ensure
    reader&.close
  end

  # A child the app forks ends on a stop, as Ruby's own TERM handler would
  # have ended it, and its parent's pipe hears nothing.
  def test_any_other_forked_child_ends_on_a_stop
    pid = fork do
      Process.kill(:URG, Process.pid)
      sleep 5
      exit!(0)
    end
    Process.wait(pid)
    assert_equal Signal.list["TERM"], $?.termsig, "ended as by TERM: #{$?.inspect}"
    assert_equal [], @signals.wait(0.2), "nothing reached the parent's pipe"
  end

  def test_only_the_commands_the_worker_acts_on_are_replayed
    Serval::Signals.take_early
    pid = Serval::Signals.forking_worker { fork do
      @signals.detach
      %i[add_worker stop].each { |c| @signals.push(c) }
      mine = Serval::Signals.new
      mine.replay_early([:stop])
      exit!(mine.wait(1) == [:stop] ? 0 : 1)
    end }
    Process.wait(pid)
    assert_predicate $?, :success?
  end
end
