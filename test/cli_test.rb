# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"

# Subprocess tier: the real exe/serval.
class CLITest < Minitest::Test
  include Serval::SubprocessHelpers

  GET = "GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"

  # Runs a command that exits by itself; returns [status, stdout, stderr].
  def run_cli(args, **kw)
    server = spawn_server(args, **kw).start
    status = server.wait(15) or flunk("serval #{args.join(' ')} did not exit\n#{server.logs}")
    server.stop # joins the log readers
    [status, server.stdout, server.stderr]
  end

  def test_help
    status, out, = run_cli(["--help"])
    assert status.success?
    assert_match(/Usage: serval \[options\]/, out)
    assert_match(/--bind URI/, out)
    assert_match(/--max-body BYTES/, out)
  end

  def test_version
    status, out, = run_cli(["-V"])
    assert status.success?
    assert_equal "Serval #{Serval::VERSION}\n", out
  end

  def test_bad_flag_exits_1_with_one_line
    status, _, err = run_cli(["--bogus"])
    assert_equal 1, status.exitstatus
    assert_equal "serval: invalid option: --bogus (see serval --help)\n", err
  end

  def test_bad_value_exits_1_naming_option
    status, _, err = run_cli(["-t", "8:4"])
    assert_equal 1, status.exitstatus
    assert_equal "serval: threads: min (8) must be <= max (4)\n", err
  end

  def test_bad_config_file_names_the_option
    files = { "config.ru" => Serval::SubprocessServer::HELLO, "config/serval.rb" => "threads 1, 2\nread_timeout(-1)\n" }
    status, _, err = run_cli([], files: files)
    assert_equal 1, status.exitstatus
    assert_equal "serval: config/serval.rb:2: read_timeout: must be >= 0.001 (got -1.0)\n", err
  end

  def test_missing_rackup_file
    status, _, err = run_cli(["-b", "tcp://127.0.0.1:0", "missing.ru"])
    assert_equal 1, status.exitstatus
    assert_match(/\Aserval: rackup: .*missing\.ru not found\n\z/, err)
  end

  def test_boot_lines_request_and_graceful_term
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:3", "-e", "test"]).boot
    out = server.stdout
    assert_match(/\AServal #{Regexp.escape(Serval::VERSION)} \(ruby #{Regexp.escape(RUBY_VERSION)}-p\d+\) starting in single mode$/, out)
    assert_includes out, "* Environment: test\n"
    assert_includes out, "* Threads: 1..3\n"
    assert_includes out, "* Listening on http://127.0.0.1:#{server.port}\n"
    server.wait_for(/Use Ctrl-C to stop/)

    response = raw_request(server.port, GET)
    assert_match(%r{\AHTTP/1\.1 200 }, response)
    assert response.end_with?("hello\n"), response

    status = server.stop
    assert_equal 0, status.exitstatus, server.logs
    assert_includes server.stdout, "- Goodbye!\n"
    refute_match(/warning/i, server.stderr)
  end

  # The app blocks on a FIFO until the test opens it, so the request is
  # provably in flight when TERM arrives; it must still get its response.
  GATED_APP = <<~RUBY
    run lambda { |_env|
      $stdout.puts "in app"
      $stdout.flush
      body = File.read("gate")
      [200, { "content-type" => "text/plain" }, [body]]
    }
  RUBY

  def test_term_drains_in_flight_request
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:1"], files: { "config.ru" => GATED_APP })
    File.mkfifo(File.join(server.dir, "gate"))
    server.boot
    response = Thread.new { raw_request(server.port, GET, read_timeout: 15) }
    server.wait_for(/^in app$/)
    server.signal("TERM")
    server.wait_for(/Gracefully stopping/)
    File.write(File.join(server.dir, "gate"), "drained\n")
    assert_match(%r{\AHTTP/1\.1 200 .*drained\n\z}m, response.value)
    status = server.wait(10) or flunk("no exit after drain\n#{server.logs}")
    assert_equal 0, status.exitstatus
    assert_includes server.stdout, "- Goodbye!\n"
  end

  def test_int_is_fast_stop
    server = spawn_server(["-b", "tcp://127.0.0.1:0"]).boot
    server.signal("INT")
    status = server.wait(10) or flunk("no exit after INT\n#{server.logs}")
    assert_equal 0, status.exitstatus
    assert_includes server.stdout, "- Goodbye!\n"
  end

  def test_quiet_prints_nothing
    port = Serval::SubprocessServer.free_port
    server = spawn_server(["-q", "-p", port.to_s]).start
    server.wait_port(port)
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(port, GET))
    assert_equal 0, server.stop.exitstatus
    assert_equal "", server.stdout
  end

  def test_pidfile_written_and_removed
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "--pidfile", "tmp/pids/serval.pid"]).boot
    path = File.join(server.dir, "tmp/pids/serval.pid")
    assert_equal "#{server.pid}\n", File.read(path)
    assert_equal 0, server.stop.exitstatus
    refute File.exist?(path), "pidfile left behind"
  end

  def test_unix_socket_bind_serves_a_request
    server = spawn_server(["-b", "unix://./serval.sock"]).boot
    path = File.join(server.dir, "serval.sock")
    assert_includes server.stdout, "* Listening on unix://./serval.sock\n"
    socket = UNIXSocket.new(path)
    socket.write(GET)
    assert socket.wait_readable(5)
    response = socket.read
    assert_match(%r{\AHTTP/1\.1 200 .*hello\n\z}m, response)
    socket.close
    assert_equal 0, server.stop.exitstatus
    refute File.exist?(path), "socket file left behind"
  end

  def test_config_file_with_unsupported_options_warns_and_boots
    files = {
      "config.ru" => Serval::SubprocessServer::HELLO,
      "config/serval.rb" => "workers 2\nplugin :tmp_restart\nbind 'tcp://127.0.0.1:0'\n"
    }
    server = spawn_server([], files: files).boot
    assert_includes server.stderr, "serval: config option `plugin` is not supported yet and is ignored"
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    assert_equal 0, server.stop.exitstatus
  end
end
