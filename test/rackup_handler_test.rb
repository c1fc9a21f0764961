# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require "rbconfig"
require "tmpdir"
require "fileutils"

class RackupHandlerTest < Minitest::Test
  include Serval::SubprocessHelpers

  def test_handler_is_registered
    require "rackup/handler/serval"
    assert_equal Rackup::Handler::Serval, Rackup::Handler.get(:serval)
    require "rack/handler/serval" # Rack 3: loads the rackup handler, no error
    assert_includes Rackup::Handler::Serval.valid_options.keys, "Threads=MIN:MAX"
  end

  def test_handler_options_map_to_serval_options
    require "serval/handler_support"
    opts = Serval::HandlerSupport.config_for(Host: "::1", Port: "8080", Threads: "2:4",
                                             environment: "test", Silent: true, Config: "-")
    assert_equal ["tcp://[::1]:8080"], opts[:binds]
    assert_equal [2, 4], opts.values_at(:min_threads, :max_threads)
    assert_equal "test", opts[:environment]
    assert opts[:quiet]
    # Rails: Host/Port the user did not give are defaults (below the config
    # file and the environment), but still beat Serval's own 0.0.0.0:9292.
    opts = Serval::HandlerSupport.config_for({ Host: "localhost", Port: 3000, user_supplied_options: [], Config: "-" }, {})
    assert_equal ["tcp://localhost:3000"], opts[:binds]
    assert_equal "rails server default Host/Port", opts[:sources][:binds]
  end

  # What `bin/rails server -u serval` passes (Rails 8's server command), in an
  # app whose config/puma.rb is the one `rails new` writes (port, threads 3:3).
  RAILS_OPTIONS = { user_supplied_options: [:server], server: "serval", log_stdout: true, Port: 3000,
                    Host: "localhost", DoNotReverseLookup: true, config: "config.ru", environment: "development",
                    daemonize: false, pid: "tmp/pids/server.pid", caching: nil,
                    restart_cmd: "bin/rails server -u serval --restart", early_hints: nil }.freeze
  PUMA_RB = File.read(File.expand_path("fixtures/rails_puma.rb", __dir__))

  def in_app(files)
    Dir.mktmpdir("serval-rails-") do |dir|
      files.each do |path, body|
        FileUtils.mkdir_p(File.dirname(File.join(dir, path)))
        File.write(File.join(dir, path), body)
      end
      Dir.chdir(dir) { yield dir }
    end
  end

  def test_rails_server_reads_config_puma_rb
    require "serval/handler_support"
    in_app("config/puma.rb" => PUMA_RB) do
      opts = Serval::HandlerSupport.config_for(RAILS_OPTIONS.dup, {})
      assert_equal [3, 3], opts.values_at(:min_threads, :max_threads)
      assert_equal "config file config/puma.rb", opts[:sources][:max_threads]
      # The file's `port 3000` listens on Rails's default host, as under Puma.
      assert_equal ["tcp://localhost:3000"], opts[:binds]
      assert_equal "config file config/puma.rb", opts[:sources][:binds]
      assert_equal ["tmp_restart"], opts[:plugins]
      assert_equal ["development", "rails server environment"], [opts[:environment], opts[:sources][:environment]]

      # -p/-b (user supplied) beat the file; the environment sits below it.
      opts = Serval::HandlerSupport.config_for(RAILS_OPTIONS.merge(user_supplied_options: %i[server Port], Port: 4000),
                                               { "RAILS_MAX_THREADS" => "5", "WEB_CONCURRENCY" => "2" })
      assert_equal ["tcp://localhost:4000"], opts[:binds]
      assert_equal "rails server Host/Port option", opts[:sources][:binds]
      # RAILS_MAX_THREADS given to Serval's environment layer only: the file's threads win.
      assert_equal [3, 3, 2], opts.values_at(:min_threads, :max_threads, :workers)
      assert_equal "env WEB_CONCURRENCY", opts[:sources][:workers]
    end
  end

  def test_rails_server_environment_picks_config_puma_env_rb
    require "serval/handler_support"
    in_app("config/puma.rb" => "threads 3, 3\n", "config/puma/production.rb" => "threads 1, 7\n") do
      opts = Serval::HandlerSupport.config_for(RAILS_OPTIONS.merge(environment: "production", Host: "0.0.0.0"), {})
      assert_equal [1, 7], opts.values_at(:min_threads, :max_threads)
      assert_equal ["tcp://0.0.0.0:3000"], opts[:binds]
    end
  end

  # A hot restart execs Rails's restart command with this Ruby; rackup gives none.
  def test_restart_argv_comes_from_rails
    require "serval/handler_support"
    in_app("bin/rails" => "") do
      assert_equal [RbConfig.ruby, "bin/rails", "server", "-u", "serval", "--restart"],
                   Serval::HandlerSupport.restart_argv(RAILS_OPTIONS)
    end
    assert_equal %w[rails server --restart], Serval::HandlerSupport.restart_argv(restart_cmd: "rails server --restart")
    assert_nil Serval::HandlerSupport.restart_argv(Port: 9292)
  end

  # A stand-in for bin/rails: calls the handler the way Rails 8's server
  # command does (Rails::Server < Rackup::Server#start), including the
  # restart command; on --restart Rails deletes its pid file first.
  FAKE_RAILS = <<~RUBY
    require "rack/lint"
    require "rackup/handler/serval"
    puts "fake rails \#{ARGV.join(" ")}"
    app = Rack::Lint.new(->(env) { [200, { "content-type" => "text/plain" }, ["pid \#{Process.pid}\n"]] })
    Rackup::Handler::Serval.run(app, user_supplied_options: [:server], server: "serval", Port: 3000, Host: "127.0.0.1",
                                config: "config.ru", environment: "development",
                                restart_cmd: "bin/rails server -u serval --restart")
  RUBY

  def test_rails_like_boot_uses_config_puma_rb_and_restarts_on_tmp_restart_txt
    port = Serval::SubprocessServer.free_port
    puma_rb = "threads 3, 3\nport #{port}\nplugin :tmp_restart\n"
    server = spawn_server(command: [RbConfig.ruby, "bin/rails", "server", "-u", "serval"],
                          files: { "bin/rails" => FAKE_RAILS, "config/puma.rb" => puma_rb },
                          env: { "WEB_CONCURRENCY" => nil, "RAILS_MAX_THREADS" => nil, "RAILS_MIN_THREADS" => nil })
    server.start.wait_for(/Listening on http:\/\/127\.0\.0\.1:#{port}/, timeout: 20)
    assert_includes server.stdout, "* Threads: 3..3 (config file config/puma.rb)\n"
    assert_includes server.stdout, "* Binds: tcp://127.0.0.1:#{port} (config file config/puma.rb)\n"
    first = raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_match(/pid #{server.pid}\n\z/, first)

    FileUtils.mkdir_p(File.join(server.dir, "tmp"))
    FileUtils.touch(File.join(server.dir, "tmp/restart.txt"))
    server.wait_for(/Restarting: exec .*bin\/rails server -u serval --restart/)
    server.wait_for(/fake rails server -u serval --restart/)
    server.wait_for(/Adopted restart fd \d+ for tcp:\/\/127\.0\.0\.1:#{port}/)
    assert_match(/pid #{server.pid}\n\z/, raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert_equal 0, server.stop.exitstatus, server.logs
  end

  # A real `bundle exec rackup -s serval` serves one request and stops on TERM.
  def test_rackup_serves_and_stops_on_term
    port = Serval::SubprocessServer.free_port
    command = [Gem.bin_path("bundler", "bundle"), "exec", "rackup", "-s", "serval",
               "-o", "127.0.0.1", "-p", port.to_s, "-O", "Threads=1:2", "config.ru"]
    server = spawn_server(command: [RbConfig.ruby, *command], env: { "RUBYOPT" => nil }).start
    server.wait_for(/Listening on http:\/\/127\.0\.0\.1:#{port}/, timeout: 20)
    assert_includes server.stdout, "* Threads: 1..2 (rackup Threads option)"

    response = raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_match(%r{\AHTTP/1\.1 200 }, response)
    assert response.end_with?("hello\n"), response

    status = server.stop
    assert_equal 0, status.exitstatus, server.logs
    assert_includes server.stdout, "- Goodbye!"
  end
end
