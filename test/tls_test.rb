# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require_relative "support/tls_cert"
require "openssl"
require "net/http"
require "tmpdir"
require "etc"
require "serval/binder"
require "serval/server"

# ssl:// listeners: the native core does the TLS handshake, reads and writes.
class TLSTest < Minitest::Test
  APP = lambda do |env|
    case env["PATH_INFO"]
    when "/echo"
      body = env["rack.input"].read
      [200, { "content-type" => "text/plain" }, ["#{env['REQUEST_METHOD']} #{body.bytesize} #{body[0, 16]}"]]
    when "/env"
      [200, { "content-type" => "text/plain" }, ["#{env['rack.url_scheme']} #{env['HTTPS']} #{env['SERVER_PORT']}"]]
    when "/big"
      [200, { "content-type" => "application/octet-stream" }, ["x" * (1024 * 1024)]]
    when "/file"
      [200, { "content-type" => "application/octet-stream" }, FileBody.new(env["test.file"] || FILE_PATH.value)]
    else
      [200, { "content-type" => "text/plain" }, ["hello"]]
    end
  end

  # Rack body served with sendfile when the response writer sees to_path.
  class FileBody
    def initialize(path)
      @path = path
    end

    def to_path
      @path
    end

    def each
      yield File.binread(@path)
    end
  end

  FILE_PATH = Struct.new(:value).new(nil)

  def self.certificate(dir)
    Serval::TLSCert.write(dir)
  end

  def setup
    skip "serval was built without OpenSSL" unless defined?(Serval::Native::TLSContext)
    @dir = Dir.mktmpdir("serval-tls-")
    @cert, @key = self.class.certificate(@dir)
    FILE_PATH.value = File.join(@dir, "file.bin")
    File.binwrite(FILE_PATH.value, Random.new(7).bytes(100 * 1024))
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  # A Server with one ssl:// listener on 127.0.0.1 (Rack::Lint around the app).
  def with_tls_server(app = APP, params: "", **opts)
    require "rack"
    require "rack/lint"
    options = Serval::Configuration::DEFAULTS.merge(opts).freeze
    binder = Serval::Binder.new(backlog: 64)
    listener = binder.bind(["ssl://127.0.0.1:0?cert=#{@cert}&key=#{@key}#{params}"]).first
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
    server = Serval::Server.new(Rack::Lint.new(app), options, log_writer: log)
    server.listen(listener.io, listener.tls)
    server.run
    yield listener.io.local_address.ip_port, listener, server
  ensure
    server&.stop(5)
    binder&.close
  end

  def http(port, verify: :ca)
    h = Net::HTTP.new("127.0.0.1", port)
    h.use_ssl = true
    if verify == :ca
      h.verify_mode = OpenSSL::SSL::VERIFY_PEER
      h.ca_file = @cert
    else
      h.verify_mode = OpenSSL::SSL::VERIFY_NONE
    end
    h.open_timeout = h.read_timeout = 10
    h
  end

  # A raw TLS connection (no certificate check), closing its TCP socket with it.
  def tls_socket(port)
    ctx = OpenSSL::SSL::SSLContext.new
    ctx.verify_mode = OpenSSL::SSL::VERIFY_NONE
    ssl = OpenSSL::SSL::SSLSocket.new(TCPSocket.new("127.0.0.1", port), ctx)
    ssl.sync_close = true
    ssl.connect
    ssl
  end

  # Thread polls (ext/serval/request.c) work with a TLS listener: request
  # threads read open sessions between requests, and a handshake met in a
  # round they run with the GVL goes back to the loop thread (loop.c
  # leave_to_loop_thread). Six clients, each five sessions of twenty
  # keep-alive requests: handshakes arrive while the threads poll, and every
  # request is answered.
  def test_thread_polls_with_a_tls_listener
    hook = Serval::Native::GVL.respond_to?(:supported?) && Serval::Native::GVL.supported?
    with_tls_server(min_threads: 4, max_threads: 4) do |port, _listener, server|
      answers = Queue.new
      Array.new(6) do
        Thread.new do
          5.times do
            h = http(port)
            h.start { 20.times { answers << h.get("/").then { |r| [r.code, r.body] } } }
          end
        rescue StandardError => e
          answers << e
        end
      end.each(&:join)
      assert_equal [%w[200 hello]], Array.new(answers.size) { answers.pop }.uniq
      stats = server.core.stats
      assert_equal hook, stats[:thread_polls]
      assert_operator stats[:polled_rounds], :>, 0 if hook
    end
  end

  def test_get_post_and_env_over_tls
    with_tls_server do |port, listener|
      assert_equal "ssl://127.0.0.1:#{port}", listener.url
      h = http(port)
      h.start do
        assert_equal "hello", h.get("/").body
        assert_equal "https on #{port}", h.get("/env").body
        body = "p" * 200_000
        res = h.post("/echo", body, "content-type" => "text/plain")
        assert_equal "POST 200000 pppppppppppppppp", res.body
      end
    end
  end

  def test_keep_alive_reuses_one_tls_session
    with_tls_server do |port|
      h = http(port, verify: :none)
      h.start do
        sockets = 5.times.map do
          assert_equal "hello", h.get("/").body
          h.instance_variable_get(:@socket).io.object_id
        end
        assert_equal 1, sockets.uniq.size
      end
    end
  end

  def test_one_megabyte_response
    with_tls_server do |port|
      res = http(port).start { |h| h.get("/big") }
      assert_equal 1024 * 1024, res.body.bytesize
      assert_equal 1024 * 1024, res["content-length"].to_i
    end
  end

  def test_to_path_file_over_tls
    with_tls_server do |port|
      h = http(port)
      h.start do
        2.times do
          res = h.get("/file")
          assert_equal File.binread(FILE_PATH.value), res.body
        end
      end
    end
  end

  def test_pipelined_requests_over_tls
    with_tls_server do |port|
      ssl = tls_socket(port)
      ssl.write("GET / HTTP/1.1\r\nhost: a\r\n\r\n" * 3 + "GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
      out = ssl.read
      assert_equal 4, out.scan("HTTP/1.1 200").size
    ensure
      ssl&.close
    end
  end

  # Streaming over TLS: each chunk is encrypted and sent when yielded; the
  # app waits until the client read chunk N before making chunk N+1.
  def test_streamed_chunks_reach_a_tls_client_as_they_are_made
    arrived = Queue.new
    body = Enumerator.new do |y|
      %w[one two three].each do |word|
        y << word
        arrived.pop
      end
    end
    app = ->(_env) { [200, { "content-type" => "text/plain" }, body] }
    with_tls_server(app) do |port|
      ssl = tls_socket(port)
      ssl.write("GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
      data = +""
      %w[one two three].each do |word|
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
        until data.include?("\r\n#{word}\r\n")
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          flunk "#{word} did not arrive over TLS; got #{data.inspect}" if left <= 0
          chunk = ssl.read_nonblock(4096, exception: false)
          if chunk == :wait_readable
            ssl.io.wait_readable(left)
          elsif chunk.nil?
            flunk "closed before #{word}"
          else
            data << chunk
          end
        end
        arrived.push(word)
      end
      data << ssl.read
      assert data.end_with?("0\r\n\r\n"), data.inspect
    ensure
      arrived.close
      ssl&.close
    end
  end

  # An error answered while OpenSSL still holds decrypted bytes (one 10 KB
  # record, read 4 KiB at a time): the lingering close that follows waits for
  # the socket instead of spinning on EPOLLOUT until its 2 s deadline.
  def test_lingering_close_over_tls_waits_without_spinning
    with_tls_server do |port|
      ssl = tls_socket(port)
      ssl.write("\x01" * 10_000) # cannot start a request line: 400 at once
      assert_match(%r{\AHTTP/1\.1 400 }, ssl.read) # up to the server's close_notify
      before = io_thread_cpu
      sleep 1 # an observation window inside the lingering close; the socket stays open
      spent = io_thread_cpu - before
      assert_operator spent, :<, 0.3, "the event-loop thread used #{spent} s of CPU in 1 s of lingering"
    ensure
      ssl&.close
    end
  end

  # CPU seconds used by this process's event-loop threads ("serval-io").
  def io_thread_cpu
    tick = Etc.sysconf(Etc::SC_CLK_TCK).to_f
    Dir.glob("/proc/self/task/*").sum do |task|
      next 0 unless (File.read("#{task}/comm") rescue "").strip == "serval-io"

      fields = File.read("#{task}/stat").split(") ", 2).last.split
      (fields[11].to_i + fields[12].to_i) / tick
    end
  end

  def test_plain_http_on_tls_port_is_closed
    with_tls_server do |port|
      out = raw_request(port, "GET / HTTP/1.1\r\nhost: a\r\n\r\n")
      refute_match(/HTTP\/1\.1 200/, out)
      # and the server still serves TLS clients
      assert_equal "hello", http(port).start { |h| h.get("/").body }
    end
  end

  def test_silent_client_is_closed_after_first_data_timeout
    with_tls_server(first_data_timeout: 0.2) do |port|
      client = Serval::HttpWire::Client.new(port)
      assert_equal :eof, client.wait_close(timeout: 5), "closed (no byte) within 5 s"
    ensure
      client&.close
    end
  end

  def test_limits_apply_over_tls
    with_tls_server(max_body: 1000) do |port|
      res = http(port).start { |h| h.post("/echo", "y" * 5000, "content-type" => "text/plain") }
      assert_equal "413", res.code
    end
  end

  def test_verify_peer_requires_a_client_certificate
    with_tls_server(params: "&verify_mode=peer&ca=#{@cert}") do |port|
      assert_raises(OpenSSL::SSL::SSLError, EOFError, Errno::ECONNRESET) do
        http(port).start { |h| h.get("/") }
      end
      h = http(port)
      h.cert = OpenSSL::X509::Certificate.new(File.read(@cert))
      h.key = OpenSSL::PKey.read(File.read(@key))
      assert_equal "hello", h.start { |c| c.get("/").body }
    end
  end

  def test_serval_command_serves_tls_and_fails_at_boot_on_a_bad_key
    require_relative "support/subprocess_server"
    bind = "ssl://127.0.0.1:0?cert=#{@cert}&key=#{@key}"
    server = Serval::SubprocessServer.new(["-b", bind, "-t", "1:2"]).start
    port = server.wait_for(%r{Listening on ssl://127\.0\.0\.1:(\d+)})[1].to_i
    assert_equal "hello\n", http(port).start { |h| h.get("/").body }
    assert server.stop.success?, server.logs

    bad = "ssl://127.0.0.1:0?cert=#{@cert}&key=#{@dir}/nokey.pem"
    failing = Serval::SubprocessServer.new(["-b", bad]).start
    refute failing.wait(15).success?
    assert_includes failing.stderr + failing.stdout, "bind #{bad}: key #{@dir}/nokey.pem: No such file or directory"
  ensure
    server&.cleanup(passed?)
    failing&.cleanup(passed?)
  end

  def test_bad_certificate_path_fails_at_bind_naming_it
    uri = "ssl://127.0.0.1:0?cert=#{@dir}/missing.pem&key=#{@key}"
    error = assert_raises(Serval::ConfigError) { Serval::Binder.new.bind([uri]) }
    assert_includes error.message, "bind #{uri}"
    assert_match(/certificate .*missing\.pem: No such file or directory/, error.message)
    File.write(File.join(@dir, "junk.pem"), "junk")
    uri = "ssl://127.0.0.1:0?cert=#{@dir}/junk.pem&key=#{@key}"
    error = assert_raises(Serval::ConfigError) { Serval::Binder.new.bind([uri]) }
    assert_match(/bind .*junk\.pem.*: certificate .*junk\.pem: /, error.message)
  end
end
