# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "serval/launcher"

# In-process tier: the Launcher with a real Server, driven through #stop.
class LauncherTest < Minitest::Test
  GET = "GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
  APP = ->(_env) { [200, { "content-type" => "text/plain" }, ["hi"]] }

  def launch(**opts)
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:0"], **opts))
    @out = StringIO.new
    log_writer = Serval::LogWriter.new(stdout: @out, stderr: StringIO.new)
    launcher = Serval::Launcher.new(options, log_writer: log_writer, app: APP, signals: false)
    thread = Thread.new { launcher.run }
    assert launcher.wait_until_booted(10), "launcher did not boot: #{@out.string}"
    [launcher, thread]
  end

  def test_boot_serve_and_graceful_stop
    launcher, thread = launch(drain_timeout: 5.0)
    port = launcher.urls.first[/:(\d+)\z/, 1].to_i
    assert_match(%r{\AHTTP/1\.1 200 .*hi\z}m, raw_request(port, GET))
    launcher.stop
    assert_equal 0, thread.value
    assert_includes @out.string, "* Listening on http://127.0.0.1:#{port}\n"
    assert @out.string.end_with?("- Goodbye!\n"), @out.string
    refute launcher.booted?
  end

  def test_fast_stop_and_pidfile
    Dir.mktmpdir do |dir|
      pidfile = File.join(dir, "pids", "serval.pid")
      launcher, thread = launch(pidfile: pidfile)
      assert_equal "#{Process.pid}\n", File.read(pidfile)
      launcher.stop(graceful: false)
      assert_equal 0, thread.value
      refute File.exist?(pidfile)
    end
  end

  # The pidfile is written as the state file is (Serval::AtomicFile): a
  # symlink planted at the temp name the old code used is not followed.
  def test_pidfile_write_follows_no_planted_symlink
    Dir.mktmpdir do |dir|
      pidfile = File.join(dir, "serval.pid")
      victim = File.join(dir, "victim")
      File.write(victim, "keep me\n")
      File.symlink(victim, "#{pidfile}.#{Process.pid}.tmp")
      old_umask = File.umask(0o077)
      launcher, thread = begin
        launch(pidfile: pidfile)
      ensure
        File.umask(old_umask)
      end
      assert_equal "keep me\n", File.read(victim)
      refute File.symlink?(pidfile)
      assert_equal "#{Process.pid}\n", File.read(pidfile)
      assert_equal 0o644, File.stat(pidfile).mode & 0o777
      assert_equal [], Dir.glob("#{pidfile}.*.tmp").reject { |f| File.symlink?(f) }, "a temp file left behind"
      launcher.stop(graceful: false)
      assert_equal 0, thread.value
    end
  end

  def test_boot_failure_is_reported_to_waiters
    taken = TCPServer.new("127.0.0.1", 0)
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:#{taken.local_address.ip_port}"]))
    launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: StringIO.new), app: APP, signals: false)
    thread = Thread.new do
      Thread.current.report_on_exception = false
      launcher.run
    end
    refute launcher.wait_until_booted(10)
    assert_raises(Serval::ConfigError) { thread.value }
  ensure
    taken&.close
  end

  def test_with_server_helper
    with_server(APP) do |_server, port|
      assert_match(%r{\AHTTP/1\.1 200 }, raw_request(port, GET))
    end
  end
end
