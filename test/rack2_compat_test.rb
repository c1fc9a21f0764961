# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "rbconfig"
require "open3"

# Rack 2 style applications. Under Rack 3 (the bundle) Rack::Lint would reject
# their responses, so the server is run without Lint for those; a real Rack 2
# (with its own Lint) is exercised in a subprocess when one is installed
# (`gem install rack -v '~> 2.2'`, or SERVAL_RACK2_LIB=/path/to/rack-2.x/lib).
class Rack2CompatTest < Minitest::Test
  include Serval::HttpWire

  class Body
    def initialize(chunks, closed) = (@chunks, @closed = chunks, closed)
    def each(&) = @chunks.each(&)
    def close = @closed << :closed
  end

  def request(path = "/")
    "GET #{path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
  end

  def test_multi_line_header_value_becomes_several_lines
    app = ->(_env) { [200, { "Set-Cookie" => "a=1\nb=2\nc=3", "Content-Type" => "text/plain" }, ["x"]] }
    with_server(app, lint: false) do |_server, port|
      res = http(port, request)
      assert_equal 200, res.status
      assert_equal %w[a=1 b=2 c=3], res.values("set-cookie")
      refute_includes res.head, "a=1\nb"
      assert_equal ["text/plain"], res.values("content-type")
    end
  end

  def test_mixed_case_content_length_is_honoured_and_not_duplicated
    closed = Queue.new
    app = ->(_env) { [200, { "Content-Length" => "11", "Content-Type" => "text/plain" }, Body.new(["hello", " world"], closed)] }
    with_server(app, lint: false) do |_server, port|
      client = connect(port)
      2.times do
        client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        res = client.read_response
        assert_equal ["11"], res.values("content-length")
        assert_empty res.values("transfer-encoding")
        assert_equal "hello world", res.body
        assert_equal :closed, closed.pop
      end
    end
  end

  def test_string_status_and_mixed_case_names
    app = ->(_env) { [+"201", { "X-Custom-Header" => "v", "Content-Type" => "text/plain" }, ["made"]] }
    with_server(app, lint: false) do |_server, port|
      res = http(port, request)
      assert_equal 201, res.status
      assert_equal "Created", res.reason
      assert_equal ["v"], res.values("x-custom-header")
      assert_equal "made", res.body
    end
  end

  # The same app a Rack 2 server would run, through Rack 2's own Lint.
  RACK2_SCRIPT = <<~'RUBY'
    rack2, serval = ARGV
    $LOAD_PATH.unshift(rack2, serval)
    require "rack"
    require "rack/lint"
    require "uri" # Rack 2.2's Lint uses URI without requiring it
    require "socket"
    require "stringio"
    require "serval/configuration"
    require "serval/log_writer"
    require "serval/server"
    abort "not Rack 2: #{Rack.release}" unless Rack.release.start_with?("2.")
    app = lambda do |env|
      body = "version=#{env['rack.version'].inspect} input=#{env['rack.input'].read}"
      [200, { "Content-Type" => "text/plain", "Set-Cookie" => "a=1\nb=2" }, [body]]
    end
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: $stderr)
    options = Serval::Configuration::DEFAULTS.merge(max_threads: 2)
    server = Serval::Server.new(Rack::Lint.new(app), options, log_writer: log)
    listener = TCPServer.new("127.0.0.1", 0)
    server.listen(listener)
    server.run
    socket = TCPSocket.new("127.0.0.1", listener.local_address.ip_port)
    socket.write("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
    print socket.read
    server.stop(5)
  RUBY

  def rack2_lib
    return ENV["SERVAL_RACK2_LIB"] if ENV["SERVAL_RACK2_LIB"]

    spec = Gem::Specification.find_all_by_name("rack").find { |s| s.version.segments.first == 2 }
    spec && File.join(spec.full_gem_path, "lib")
  end

  def test_under_rack2_with_rack2_lint
    lib = rack2_lib
    skip "Rack 2 is not installed (gem install rack -v '~> 2.2', or set SERVAL_RACK2_LIB)" unless lib

    out, err, status = Open3.capture3({ "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil }, RbConfig.ruby, "-w", "-e",
                                      RACK2_SCRIPT, lib, File.expand_path("../lib", __dir__))
    assert status.success?, err
    assert out.start_with?("HTTP/1.1 200 OK\r\n"), out + err
    head = out.split("\r\n\r\n", 2).first
    assert_equal 2, head.scan(/^set-cookie: [ab]=\d\r?$/i).size, head
    # Rack 2's Lint body has no to_ary: the length is unknown, so it is chunked
    assert_match(/^transfer-encoding: chunked\r?$/i, head)
    assert_equal "version=[1, 6] input=body", parse_response(out).body
  end

  # The child's bytes read as one response by the suite's client.
  def parse_response(bytes)
    reader, writer = IO.pipe
    writer.write(bytes)
    writer.close
    Serval::HttpWire::Client.new(reader).read_response
  ensure
    reader&.close
  end
end
