# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require "fileutils"
require "serval/plugins/tmp_restart"

# `plugin :tmp_restart`: touching tmp/restart.txt hot-restarts the server.
class TmpRestartTest < Minitest::Test
  include Serval::SubprocessHelpers

  GET = "GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"

  # Stands in for the launcher: records what the plugin queues.
  class FakeLauncher
    attr_reader :options, :log_writer, :commands

    def initialize(dir)
      @options = { directory: dir }
      @log_writer = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
      @commands = Queue.new
    end

    def wait_until_booted(_timeout) = true
    def enqueue(command) = @commands << command
  end

  def setup
    @dir = Dir.mktmpdir("serval-tmp-restart-")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # Each change is seen once (the new state is remembered); a file that
  # exists when the plugin starts, or is deleted, restarts nothing; a file
  # that appears does.
  def test_check_queues_a_restart_when_the_file_appears_or_changes
    launcher = FakeLauncher.new(@dir)
    path = File.join(@dir, "tmp/restart.txt")
    FileUtils.mkdir_p(File.dirname(path))
    FileUtils.touch(path)
    plugin = Serval::Plugins::TmpRestart.new(launcher)
    assert_equal path, plugin.path
    refute plugin.check
    File.utime(Time.now, Time.now + 5, path)
    assert plugin.check
    refute plugin.check
    File.unlink(path)
    refute plugin.check
    FileUtils.touch(path)
    assert plugin.check
    assert_equal [:restart, :restart], [launcher.commands.pop, launcher.commands.pop]
    assert_empty launcher.commands
    assert_includes launcher.log_writer.stdout.string, "- #{path} changed: hot restart (plugin tmp_restart)"
  end

  # The thread looks on its own once booted, and stops when told.
  def test_thread_looks_until_stopped
    launcher = FakeLauncher.new(@dir)
    plugin = Serval::Plugins::TmpRestart.new(launcher, interval: 0.01).start
    FileUtils.mkdir_p(File.join(@dir, "tmp"))
    FileUtils.touch(File.join(@dir, "tmp/restart.txt"))
    assert_equal :restart, launcher.commands.pop
    plugin.stop
    assert_empty launcher.commands
  end

  # A real exe/serval: the touch makes it exec itself again (same pid, the
  # listening socket adopted), in single and in cluster mode.
  def test_touch_restarts_single_mode
    assert_restarts_on_touch([])
  end

  def test_touch_restarts_cluster_mode
    assert_restarts_on_touch(["-w", "1"])
  end

  private

  def assert_restarts_on_touch(args)
    files = { "config.ru" => Serval::SubprocessServer::HELLO, "config/serval.rb" => "plugin :tmp_restart\n" }
    server = spawn_server(["-b", "tcp://127.0.0.1:0", *args], files: files).boot
    server.wait_for(/Use Ctrl-C/)
    assert_includes server.stdout, "* Plugins: tmp_restart (config file config/serval.rb)\n"
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    refute_includes server.stdout, "Adopted restart fd"

    FileUtils.mkdir_p(File.join(server.dir, "tmp"))
    FileUtils.touch(File.join(server.dir, "tmp/restart.txt"))
    server.wait_for(/tmp\/restart\.txt changed: hot restart/)
    server.wait_for(/Adopted restart fd \d+ for tcp:\/\/127\.0\.0\.1:0/, timeout: 15)
    assert_match(%r{\AHTTP/1\.1 200 .*hello\n\z}m, raw_request(server.port, GET, read_timeout: 10))
    assert_equal 2, server.stdout.scan(/starting in (single|cluster) mode/).size, server.logs
    refute server.exited?
    assert_equal 0, server.stop.exitstatus
    assert_equal 1, server.stdout.scan("- Goodbye!").size
  end
end
