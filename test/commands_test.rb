# frozen_string_literal: true

require_relative "test_helper"
require "serval/launcher"
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

  def test_every_signal_of_the_docs_is_in_the_table
    doc = File.read(File.expand_path("../docs/signals.md", __dir__))
    Serval::Commands::SIGNALS.each_key do |signal|
      assert_includes doc, "`#{signal}`", "docs/signals.md names #{signal}" unless signal == Serval::Commands::DUMP_SIGNAL
    end
  end
end
