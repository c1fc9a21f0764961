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
    assert_includes out, "* Environment: test (flag -e)\n"
    assert_includes out, "* Threads: 1..3 (flag -t)\n"
    assert_includes out, "* Workers: 0 (default)\n"
    assert_includes out, "* Binds: tcp://127.0.0.1:0 (flag -b)\n"
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
      "config/serval.rb" => "workers 2\nplugin :tmp_restart\ndrain_on_shutdown\nbind 'tcp://127.0.0.1:0'\n"
    }
    server = spawn_server([], files: files).boot
    assert_includes server.stderr, "serval: config option `drain_on_shutdown` is not supported yet and is ignored"
    refute_includes server.stderr, "plugin `tmp_restart`"
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    assert_equal 0, server.stop.exitstatus
  end

  # Variables a test runner might have set are cleared for these tests.
  NO_ENV = %w[WEB_CONCURRENCY RAILS_MAX_THREADS RAILS_MIN_THREADS PUMA_MAX_THREADS PUMA_MIN_THREADS MAX_THREADS
              MIN_THREADS APP_ENV RACK_ENV RAILS_ENV].to_h { |k| [k, nil] }.freeze

  # Puma starts WEB_CONCURRENCY workers when the configuration sets none.
  def test_web_concurrency_starts_cluster_mode
    server = spawn_server(["-b", "tcp://127.0.0.1:0"], env: NO_ENV.merge("WEB_CONCURRENCY" => "2")).boot
    assert_includes server.stdout, "starting in cluster mode\n"
    assert_includes server.stdout, "* Workers: 2 (env WEB_CONCURRENCY), preload: true\n"
    server.wait_for(/Worker 1 \(PID: \d+\) booted/)
    server.wait_for(/Worker 0 \(PID: \d+\) booted/)
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    assert_equal 0, server.stop.exitstatus
  end

  def test_bad_web_concurrency_fails_naming_it
    status, _, err = run_cli(["-b", "tcp://127.0.0.1:0"], env: NO_ENV.merge("WEB_CONCURRENCY" => "abc"))
    assert_equal 1, status.exitstatus
    assert_equal %(serval: WEB_CONCURRENCY: expected a number of workers or auto, got "abc"\n), err
  end

  # Without config/serval.rb, config/puma.rb is read (as puma and Puma's Rack
  # handler do); it beats the environment, flags beat it.
  def test_config_puma_rb_is_read_and_sources_are_printed
    files = { "config.ru" => Serval::SubprocessServer::HELLO,
              "config/puma.rb" => %(threads 3, 3\nworkers ENV.fetch("W", 0)\nbind "tcp://127.0.0.1:0"\n) }
    env = NO_ENV.merge("RAILS_MAX_THREADS" => "9", "RAILS_MIN_THREADS" => "9", "RAILS_ENV" => "staging")
    server = spawn_server([], files: files, env: env).boot
    out = server.stdout
    assert_includes out, "* Environment: staging (env RAILS_ENV)\n"
    assert_includes out, "* Threads: 3..3 (config file config/puma.rb)\n"
    assert_includes out, "* Workers: 0 (config file config/puma.rb)\n"
    assert_includes out, "* Binds: tcp://127.0.0.1:0 (config file config/puma.rb)\n"
    assert_equal 0, server.stop.exitstatus

    server = spawn_server(["-t", "2:4", "-p", "0"], files: files, env: env).start
    server.wait_for(/Use Ctrl-C/)
    assert_includes server.stdout, "* Threads: 2..4 (flag -t)\n"
    assert_includes server.stdout, "* Binds: tcp://0.0.0.0:0 (flag -p)\n"
    assert_equal 0, server.stop.exitstatus
  end

  # stdout is a pipe here: a line the app prints while serving (no flush of
  # its own) must arrive while the server runs, not when it exits.
  def test_app_output_reaches_a_pipe_at_once
    app = %(run ->(env) { puts "app says hi"; [200, { "content-type" => "text/plain" }, ["ok"]] }\n)
    server = spawn_server(["-b", "tcp://127.0.0.1:0"], files: { "config.ru" => app }).boot
    server.wait_for(/Use Ctrl-C/)
    assert_match(%r{\AHTTP/1\.1 200 }, raw_request(server.port, GET))
    server.wait_for(/^app says hi$/, timeout: 5)
    refute server.exited?
    assert_equal 0, server.stop.exitstatus
  end
end
