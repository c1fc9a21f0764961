# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "tmpdir"
require_relative "support/tls_cert"

# Generated response bodies (no to_path) that the client reads slowly or not
# at all: memory is bounded per connection (output_buffer) and per process
# (output_budget); the rest spills to an unlinked temp file in tmpdir that
# the loop sends from, so the Ruby thread is free; past max_spill (or when
# the disk refuses) the writer waits for its client instead of growing
# memory. Every response still arrives byte-exact, in order.
class OutputSpillTest < Minitest::Test
  include Serval::HttpWire

  MB = 1 << 20
  BIG = Random.new(20).bytes(20 * MB).freeze
  FOUR = BIG.byteslice(0, 4 * MB).freeze
  THREE = BIG.byteslice(0, 3 * MB).freeze

  # Counts events from app threads; waits for a number with a deadline
  # (Queue#pop has no timeout on Ruby 3.1).
  class Counter
    def initialize
      @n = 0
      @mutex = Mutex.new
      @cond = ConditionVariable.new
    end

    def bump
      @mutex.synchronize do
        @n += 1
        @cond.broadcast
      end
    end

    def wait_for(count, timeout)
      deadline = now + timeout
      @mutex.synchronize do
        while @n < count
          left = deadline - now
          return @n if left <= 0

          @cond.wait(@mutex, left)
        end
        @n
      end
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Polls the server's stats until the block is true or `timeout` passes;
  # returns the last stats (the caller asserts on them).
  def stats_until(server, timeout: 10)
    deadline = now + timeout
    loop do
      s = server.stats
      return s if yield(s) || now > deadline

      sleep 0.01
    end
  end

  # Small kernel buffers on both sides, so unread responses stay in Serval
  # (accepted sockets inherit the listener's SO_SNDBUF).
  def small_send_buffers(server)
    server.instance_variable_get(:@listeners).each { |l| l.setsockopt(Socket::SOL_SOCKET, Socket::SO_SNDBUF, 16_384) }
  end

  def slow_socket(port)
    s = Socket.new(:INET, :STREAM)
    s.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, 8192) # before connect: a small window
    s.connect(Socket.sockaddr_in(port, "127.0.0.1"))
    s
  end

  # GET PATH answers bodies[PATH] (counted), anything else "fresh"; a HEAD
  # gets the length without a body (as Rack::Head would make it).
  def app_for(counter, bodies)
    lambda do |env|
      path = env["PATH_INFO"]
      body = bodies.fetch(path, "fresh")
      if env["REQUEST_METHOD"] == "HEAD"
        [200, { "content-type" => "application/octet-stream", "content-length" => body.bytesize.to_s }, []]
      else
        counter&.bump if bodies.key?(path)
        [200, { "content-type" => "application/octet-stream" }, [body]]
      end
    end
  end

  # This process's open files in dir: [[fd, link target], ...].
  def spill_fds(dir)
    Dir.children("/proc/self/fd").filter_map do |fd|
      target = File.readlink("/proc/self/fd/#{fd}")
      [fd, target] if target.start_with?("#{dir}/")
    rescue SystemCallError
      nil
    end
  end

  # The issue's case: 4 threads, 6 clients that do not read a generated
  # 20 MB body. Every request reaches the app, the threads are all free
  # again, a fresh client is answered at once, and then each slow client
  # reads its body byte-exact.
  def test_slow_readers_of_a_big_generated_body_hold_no_thread
    answered = Counter.new
    sockets = []
    with_server(app_for(answered, "/20mb" => BIG), max_threads: 4, write_timeout: 60) do |server, port|
      small_send_buffers(server)
      6.times do
        s = slow_socket(port)
        s.write("GET /20mb HTTP/1.1\r\nHost: h\r\n\r\n")
        sockets << s
      end
      assert_equal 6, answered.wait_for(6, 10), "every slow request reached the app (4 threads)"
      s = stats_until(server) { |st| st[:busy_threads].zero? }
      assert_equal 0, s[:busy_threads], "no thread is writing to a slow reader"
      assert_operator s[:output_spills], :>=, 6
      assert_operator s[:output_spilled_bytes], :>, 6 * 10 * MB

      t0 = now
      res = http(port, "GET /fresh HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout: 5)
      assert_equal 200, res.status
      assert_equal "fresh", res.body
      assert_operator now - t0, :<, 5.0

      sockets.each do |sock|
        late = Client.new(sock, timeout: 10).read_response
        assert_equal 200, late.status
        assert_equal BIG.bytesize, late.body.bytesize
        assert late.body == BIG, "20 MB body byte-exact"
      end
      s = stats_until(server) { |st| st[:output_spilled_bytes].zero? }
      assert_equal 0, s[:output_spilled_bytes], "the spill files were released"
    end
  ensure
    sockets.each(&:close)
  end

  # output_budget bounds the memory of all output buffers together: 8
  # non-reading clients of 4 MB with output_buffer 512 KiB would hold 4 MiB;
  # with a 1 MiB budget the rest is spilled.
  def test_the_process_wide_budget_is_respected
    answered = Counter.new
    sockets = []
    opts = { max_threads: 4, write_timeout: 60, output_buffer: 512 * 1024, output_budget: MB }
    with_server(app_for(answered, "/4mb" => FOUR), **opts) do |server, port|
      small_send_buffers(server)
      8.times do
        s = slow_socket(port)
        s.write("GET /4mb HTTP/1.1\r\nHost: h\r\n\r\n")
        sockets << s
      end
      assert_equal 8, answered.wait_for(8, 10)
      s = stats_until(server) { |st| st[:busy_threads].zero? }
      assert_equal 0, s[:busy_threads]
      # the budget, plus the 16 KiB a buffer may always have (SV_OUT_MIN)
      assert_operator s[:output_buffered_bytes], :<=, MB + (9 * 16_384)
      assert_operator s[:output_buffered_bytes], :>, 0
      assert_operator s[:output_spilled_bytes], :>=, (8 * 4 * MB) - MB - (8 * 200_000)
      require "serval/prometheus"
      metrics = Serval::Prometheus.render(s)
      assert_match(/^serval_output_buffered_bytes #{s[:output_buffered_bytes]}$/, metrics)
      assert_match(/^serval_output_spilled_bytes #{s[:output_spilled_bytes]}$/, metrics)
      assert_match(/^serval_output_spills_total 8$/, metrics)

      sockets.each do |sock|
        late = Client.new(sock, timeout: 10).read_response
        assert late.body == FOUR, "4 MB body byte-exact"
      end
      s = stats_until(server) { |st| st[:output_spilled_bytes].zero? && st[:output_buffered_bytes] <= 9 * 16_384 }
      assert_equal 0, s[:output_spilled_bytes]
      assert_operator s[:output_buffered_bytes], :<=, 9 * 16_384, "big output buffers were freed"
    end
  ensure
    sockets.each(&:close)
  end

  # max_spill bounds the spill files together; past it the writer waits for
  # its client (no more memory either), and the responses stay intact.
  def test_max_spill_makes_the_writer_wait
    answered = Counter.new
    sockets = []
    opts = { max_threads: 4, write_timeout: 60, output_buffer: 65_536, max_spill: MB }
    with_server(app_for(answered, "/3mb" => THREE), **opts) do |server, port|
      small_send_buffers(server)
      2.times do
        s = slow_socket(port)
        s.write("GET /3mb HTTP/1.1\r\nHost: h\r\n\r\n")
        sockets << s
      end
      assert_equal 2, answered.wait_for(2, 10)
      s = stats_until(server) { |st| st[:output_waits] >= 2 }
      assert_operator s[:output_waits], :>=, 2, "both writers wait"
      assert_operator s[:busy_threads], :>=, 1
      assert_operator s[:output_spilled_bytes], :<=, MB
      assert_operator s[:output_buffered_bytes], :<=, 2 * 65_536 + 16_384

      sockets.each do |sock|
        late = Client.new(sock, timeout: 10).read_response
        assert late.body == THREE, "3 MB body byte-exact"
      end
    end
  ensure
    sockets.each(&:close)
  end

  # No spill at all (max_spill 0), or a tmpdir where no file can be made:
  # the writer waits as it did before spills existed; the body is intact.
  def test_spill_refused_writer_waits_and_the_body_is_intact
    [{ max_spill: 0 }, { tmpdir: File.join(Dir.tmpdir, "serval-no-such-dir-#{$$}") }].each do |extra|
      answered = Counter.new
      sock = nil
      opts = { max_threads: 2, write_timeout: 60, output_buffer: 65_536 }.merge(extra)
      with_server(app_for(answered, "/3mb" => THREE), **opts) do |server, port|
        small_send_buffers(server)
        sock = slow_socket(port)
        sock.write("GET /3mb HTTP/1.1\r\nHost: h\r\n\r\n")
        assert_equal 1, answered.wait_for(1, 10)
        s = stats_until(server) { |st| st[:output_waits] >= 1 }
        assert_operator s[:output_waits], :>=, 1, extra.inspect
        assert_equal 0, s[:output_spills], extra.inspect
        assert_equal 0, s[:output_spilled_bytes]
        assert_operator s[:output_buffered_bytes], :<=, 65_536 + 16_384

        late = Client.new(sock, timeout: 10).read_response
        assert late.body == THREE, "#{extra.inspect}: body byte-exact"
      end
    ensure
      sock&.close
    end
  end

  # A spill is an unlinked file (nothing to leak, no name to find) of mode
  # 0600 in tmpdir, released when its response is sent.
  def test_spill_files_are_unlinked_private_and_released
    answered = Counter.new
    sock = nil
    Dir.mktmpdir("serval-spill-") do |dir|
      opts = { max_threads: 2, write_timeout: 60, output_buffer: 65_536, tmpdir: dir }
      with_server(app_for(answered, "/4mb" => FOUR), **opts) do |server, port|
        small_send_buffers(server)
        sock = slow_socket(port)
        sock.write("GET /4mb HTTP/1.1\r\nHost: h\r\n\r\n")
        assert_equal 1, answered.wait_for(1, 10)
        stats_until(server) { |st| st[:output_spills] >= 1 }
        assert_empty Dir.children(dir), "no name in tmpdir"
        spills = spill_fds(dir)
        assert_equal 1, spills.size, "one open spill file"
        fd, target = spills.first
        assert target.end_with?("(deleted)") || target.include?("#"), target
        assert_equal 0o600, File.stat("/proc/self/fd/#{fd}").mode & 0o777

        assert Client.new(sock, timeout: 10).read_response.body == FOUR
        s = stats_until(server) { |st| st[:output_spilled_bytes].zero? && spill_fds(dir).empty? }
        assert_equal 0, s[:output_spilled_bytes]
        assert_empty spill_fds(dir), "the spill file was closed"
      end
    ensure
      sock&.close
    end
  end

  # Keep-alive and pipelining: a spilled response, then a small one and a
  # HEAD of the big one on the same connection arrive whole and in order.
  def test_pipelined_responses_after_a_spill_stay_in_order
    answered = Counter.new
    sock = nil
    opts = { max_threads: 2, write_timeout: 60, output_buffer: 65_536 }
    with_server(app_for(answered, "/4mb" => FOUR), **opts) do |server, port|
      small_send_buffers(server)
      sock = slow_socket(port)
      sock.write("GET /4mb HTTP/1.1\r\nHost: h\r\n\r\nGET /small HTTP/1.1\r\nHost: h\r\n\r\n" \
                 "HEAD /4mb HTTP/1.1\r\nHost: h\r\n\r\nGET /4mb HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_equal 1, answered.wait_for(1, 10)
      stats_until(server) { |st| st[:output_spills] >= 1 }
      client = Client.new(sock, timeout: 10)
      first = client.read_response
      assert first.body == FOUR, "spilled body byte-exact"
      assert_equal "fresh", client.read_response.body
      head = client.read_response(head_request: true)
      assert_equal((4 * MB).to_s, head["content-length"])
      last = client.read_response
      assert last.body == FOUR
      assert client.closed_by_peer?, "nothing after the last response (HEAD sent no body)"
    end
  ensure
    sock&.close
  end

  # A streamed (chunked) body whose chunks overflow output_buffer while the
  # client is not reading: the chunk framing survives the spill.
  def test_chunked_body_spilled_is_framed_correctly
    chunks = [BIG.byteslice(0, MB), BIG.byteslice(MB, 5), BIG.byteslice(2 * MB, MB + 7)]
    app = lambda do |_env|
      [200, { "content-type" => "application/octet-stream" }, Enumerator.new { |y| chunks.each { |c| y << c } }]
    end
    sock = nil
    with_server(app, max_threads: 2, write_timeout: 60, output_buffer: 65_536) do |server, port|
      small_send_buffers(server)
      sock = slow_socket(port)
      sock.write("GET /stream HTTP/1.1\r\nHost: h\r\n\r\nGET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
      s = stats_until(server) { |st| st[:output_spills] >= 1 }
      assert_operator s[:output_spills], :>=, 1, "the first chunk spilled"
      client = Client.new(sock, timeout: 10)
      2.times do
        res = client.read_response
        assert_equal "chunked", res["transfer-encoding"]
        assert res.body == chunks.join, "chunked body byte-exact"
        expected = chunks.map { |c| "#{c.bytesize.to_s(16)}\r\n#{c}\r\n" }.join + "0\r\n\r\n"
        assert res.raw_body == expected.b, "chunk framing exact"
      end
    end
  ensure
    sock&.close
  end

  # TLS: the loop cannot sendfile through OpenSSL; the spill is read back in
  # chunks into the TLS writer. A generated 4 MB body that spilled while the
  # client did not read arrives byte-exact, the thread free meanwhile.
  def test_spilled_body_over_tls
    skip "serval was built without OpenSSL" unless defined?(Serval::Native::TLSContext)
    require "openssl"
    require "serval/binder"
    require "serval/server"
    require "rack/lint"
    answered = Counter.new
    Dir.mktmpdir("serval-tls-") do |dir|
      cert, key = Serval::TLSCert.write(dir)
      binder = Serval::Binder.new(backlog: 64)
      listener = binder.bind(["ssl://127.0.0.1:0?cert=#{cert}&key=#{key}"]).first
      listener.io.setsockopt(Socket::SOL_SOCKET, Socket::SO_SNDBUF, 16_384)
      options = Serval::Configuration::DEFAULTS.merge(max_threads: 2, write_timeout: 60, output_buffer: 65_536).freeze
      log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
      server = Serval::Server.new(Rack::Lint.new(app_for(answered, "/4mb" => FOUR)), options, log_writer: log)
      server.listen(listener.io, listener.tls)
      server.run
      ssl = tls_connect(listener.io.local_address.ip_port, cert)
      ssl.write("GET /4mb HTTP/1.1\r\nHost: h\r\n\r\nGET /small HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal 1, answered.wait_for(1, 10)
      s = stats_until(server) { |st| st[:output_spills] >= 1 && st[:busy_threads].zero? }
      assert_operator s[:output_spills], :>=, 1
      assert_equal 0, s[:busy_threads], "the thread is free while the TLS client does not read"
      reader = TLSReader.new(ssl)
      head, body = reader.response
      assert_match(/\AHTTP\/1\.1 200/, head)
      assert body == FOUR, "4 MB body over TLS byte-exact"
      assert_equal "fresh", reader.response.last
    ensure
      ssl&.close
      server&.stop(5)
      binder&.close
    end
  end

  def tls_connect(port, ca)
    sock = slow_socket(port)
    ctx = OpenSSL::SSL::SSLContext.new
    ctx.verify_mode = OpenSSL::SSL::VERIFY_PEER
    ctx.ca_file = ca
    ssl = OpenSSL::SSL::SSLSocket.new(sock, ctx)
    ssl.sync_close = true
    ssl.connect
    ssl
  end

  # Reads content-length responses from an SSLSocket, each read bounded.
  class TLSReader
    def initialize(ssl, timeout: 10)
      @ssl = ssl
      @timeout = timeout
      @buf = +"".b
    end

    # [head, body]
    def response
      more until (i = @buf.index("\r\n\r\n"))
      head = @buf.slice!(0, i + 4)
      length = Integer(head[/^content-length: *(\d+)/i, 1], 10)
      more while @buf.bytesize < length
      [head, @buf.slice!(0, length)]
    end

    private

    def more
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout
      loop do
        chunk = @ssl.read_nonblock(65_536, exception: false)
        return @buf << chunk if chunk.is_a?(String)
        raise EOFError, "TLS connection closed" if chunk.nil?

        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        ready = chunk == :wait_readable ? IO.select([@ssl.to_io], nil, nil, left) : IO.select(nil, [@ssl.to_io], nil, left)
        raise "no TLS data within #{@timeout}s" if left <= 0 || ready.nil?
      end
    end
  end
end
