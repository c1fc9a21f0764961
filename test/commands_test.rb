# frozen_string_literal: true

require_relative "test_helper"
require "serval/launcher"
require "serval/single"
require "serval/cluster"
require "serval/control_app"
require "serval/ctl"

# One command table (lib/serval/commands.rb) behind the launcher, the
# signals, the control app and servalctl: they cannot drift apart.
class CommandsTest < Minitest::Test
  def test_every_way_in_reaches_a_launcher_command
    commands = Serval::Launcher::COMMANDS
    assert_equal Serval::Commands::TABLE.keys, commands
    (Serval::Signals::MASTER.values - [:child]).each { |c| assert_includes commands, c }
    Serval::ControlApp::COMMANDS.each_value { |c| assert_includes commands, c }
  end

  def test_servalctl_names_are_the_control_paths
    paths = Serval::ControlApp::COMMANDS.keys + Serval::ControlApp::QUERIES.keys
    (Serval::Ctl::COMMANDS - %w[status advise]).each do |name|
      assert_includes paths, "/#{name}", name
    end
    assert_includes Serval::Ctl::COMMANDS, "advise"
  end

  # Each process has a handler (on_<command>) for exactly the commands the
  # table says it acts on; one it lacks is refused, never silently dropped.
  def test_every_process_handles_what_the_table_says
    handles = ->(klass, c) { klass.private_method_defined?(:"on_#{c}") || klass.method_defined?(:"on_#{c}") }
    Serval::Commands::TABLE.each do |command, (_, _, scope)|
      assert handles.call(Serval::Cluster, command), "Cluster handles #{command}"
      assert_equal scope != :cluster, handles.call(Serval::Single, command), "Single and #{command} (#{scope})"
      assert_equal scope == :every, handles.call(Serval::Cluster::Worker, command), "Worker and #{command} (#{scope})"
    end
    assert handles.call(Serval::Single, :stopped)
  end

  # The worker's signals are the docs/signals.md "Worker processes" table,
  # derived from the one command table.
  def test_worker_signals
    dump = Serval::Commands::DUMP_SIGNAL
    expected = { "TERM" => :stop, "QUIT" => :stop, "INT" => :halt, "HUP" => :reopen_logs, dump => :dump_threads,
                 "USR1" => :ignore, "USR2" => :ignore, "URG" => :ignore, "TTIN" => :ignore, "TTOU" => :ignore, "CHLD" => :ignore }
    assert_equal expected, Serval::Signals::WORKER
    assert_equal Serval::Commands::SIGNALS.merge("CHLD" => :child), Serval::Signals::MASTER
    refute Serval::Signals::SINGLE.key?("CHLD")
  end

  def test_dispatch_calls_the_handler_or_reports_none
    calls = []
    receiver = Object.new
    receiver.define_singleton_method(:on_stop) { calls << :stop }
    assert Serval::Commands.dispatch(receiver, :stop)
    refute Serval::Commands.dispatch(receiver, :halt)
    refute Serval::Commands.dispatch(receiver, :nonsense)
    assert_equal [:stop], calls
  end

  def test_every_signal_of_the_docs_is_in_the_table
    doc = File.read(File.expand_path("../docs/signals.md", __dir__))
    Serval::Commands::SIGNALS.each_key do |signal|
      assert_includes doc, "`#{signal}`", "docs/signals.md names #{signal}" unless signal == Serval::Commands::DUMP_SIGNAL
    end
  end
end
