# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require "rbconfig"

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
    # Rails: Host/Port the user did not give leave the config file's binds alone.
    opts = Serval::HandlerSupport.config_for(Host: "localhost", Port: 3000, user_supplied_options: [],
                                             Config: "-")
    assert_equal Serval::Configuration::DEFAULTS[:binds], opts[:binds]
  end

  # A real `bundle exec rackup -s serval` serves one request and stops on TERM.
  def test_rackup_serves_and_stops_on_term
    port = Serval::SubprocessServer.free_port
    command = [Gem.bin_path("bundler", "bundle"), "exec", "rackup", "-s", "serval",
               "-o", "127.0.0.1", "-p", port.to_s, "-O", "Threads=1:2", "config.ru"]
    server = spawn_server(command: [RbConfig.ruby, *command], env: { "RUBYOPT" => nil }).start
    server.wait_for(/Listening on http:\/\/127\.0\.0\.1:#{port}/, timeout: 20)
    assert_includes server.stdout, "* Threads: 1..2"

    response = raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_match(%r{\AHTTP/1\.1 200 }, response)
    assert response.end_with?("hello\n"), response

    status = server.stop
    assert_equal 0, status.exitstatus, server.logs
    assert_includes server.stdout, "- Goodbye!"
  end
end
