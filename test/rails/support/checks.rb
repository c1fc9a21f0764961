# frozen_string_literal: true

require "digest/md5"
require "json"
require "securerandom"
require "tmpdir"

module RailsIntegration
  # The checks every boot mode runs against examples/rails, as minitest
  # methods. The including class provides `server` (a booted AppServer) and
  # `expect_pool_warning?`.
  module Checks
    UPLOAD_BYTES = 150 * 1024 * 1024
    ORIGIN_OK = "http://127.0.0.1"

    def client = HttpClient.new(server.port)

    # Scaffold CRUD through the HTML forms: every write carries the form's
    # authenticity_token and the session cookie; one without is refused.
    def test_crud_with_csrf
      http = client
      _res, token = http.form_token("/posts/new", form_action: "/posts")
      title = "serval #{SecureRandom.hex(4)}"
      created = http.post_form("/posts", "authenticity_token" => token, "post[title]" => title, "post[body]" => "first")
      assert_equal 302, created.status, created.head
      id = created["location"][%r{/posts/(\d+)\z}, 1] or flunk "no post id in #{created['location']}"
      assert_includes http.follow(created).body, title

      _res, token = http.form_token("/posts/#{id}/edit", form_action: "/posts/#{id}")
      updated = http.post_form("/posts/#{id}", "_method" => "patch", "authenticity_token" => token,
                                               "post[title]" => "#{title} edited", "post[body]" => "second")
      assert_includes [302, 303], updated.status, updated.head
      assert_includes http.follow(updated).body, "#{title} edited"

      forged = http.post_form("/posts/#{id}", "_method" => "delete", "authenticity_token" => "forged")
      assert_equal 422, forged.status, "a DELETE with a wrong token must be refused"
      _res, token = http.form_token("/posts/#{id}", form_action: "/posts/#{id}")
      deleted = http.post_form("/posts/#{id}", "_method" => "delete", "authenticity_token" => token)
      assert_includes [302, 303], deleted.status, deleted.head
      assert_equal 404, http.get("/posts/#{id}").status
    end

    # ActionController::Live: 4 chunks written 0.3 s apart must reach the
    # socket 0.3 s apart, not all at the end.
    def test_live_chunks_arrive_spaced
      socket = TCPSocket.new("127.0.0.1", server.port)
      socket.write("GET /stream?count=4&interval=0.3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      seen = {}
      data = +"".b
      deadline = now + 15
      until seen.size == 4
        left = deadline - now
        flunk "only #{seen.size} chunks within 15 s: #{data.inspect}" if left <= 0 || !socket.wait_readable(left)
        chunk = socket.read_nonblock(65_536, exception: false)
        break if chunk.nil?
        next if chunk == :wait_readable

        data << chunk
        data.scan(/chunk (\d)/) { |(i)| seen[i.to_i] ||= now }
      end
      assert_equal [0, 1, 2, 3], seen.keys.sort, data
      gaps = (1..3).map { |i| seen[i] - seen[i - 1] }
      assert gaps.all? { |g| g >= 0.15 }, "chunks arrived together (gaps #{gaps.map { |g| g.round(3) }}): not flushed as written"
      assert_match(%r{\AHTTP/1\.1 200}, data)
    ensure
      socket&.close
    end

    # Action Cable: handshake, subscribe, a message out and its echo back.
    def test_websocket_round_trip
      ws = WebSocketClient.new("127.0.0.1", server.port, "/cable", origin: "#{ORIGIN_OK}:#{server.port}",
                                                                   protocols: %w[actioncable-v1-json actioncable-unsupported])
      assert_equal "actioncable-v1-json", ws.protocol
      assert_equal "welcome", next_cable_message(ws)["type"]
      identifier = JSON.generate(channel: "EchoChannel")
      ws.send_text(JSON.generate(command: "subscribe", identifier: identifier))
      assert_equal "confirm_subscription", next_cable_message(ws)["type"]
      text = "hello #{SecureRandom.hex(4)}"
      ws.send_text(JSON.generate(command: "message", identifier: identifier,
                                 data: JSON.generate(action: "speak", text: text)))
      echo = next_cable_message(ws)
      assert_equal identifier, echo["identifier"]
      assert_equal text, echo.dig("message", "text")
    ensure
      ws&.close
    end

    # A 150 MB file through a multipart form into Active Storage (disk
    # service), streamed from a file by the client.
    def test_upload_150mb_to_active_storage
      path = File.join(Dir.tmpdir, "serval-rails-upload-#{Process.pid}.bin")
      write_upload_file(path)
      http = client
      _res, token = http.form_token("/documents/new", form_action: "/documents")
      res = http.post_multipart_file("/documents", fields: { "authenticity_token" => token }, file_field: "document[file]",
                                                   file_path: path, filename: "big.bin", content_type: "application/octet-stream")
      assert_equal 201, res.status, "#{res.head}\n#{res.body[0, 500]}"
      doc = JSON.parse(res.body)
      assert_equal UPLOAD_BYTES, doc["byte_size"]
      assert_equal UPLOAD_BYTES, doc["stored_bytes"], "the file on the disk service"
      assert_equal Digest::MD5.file(path).base64digest, doc["checksum"]
      token = HttpClient.meta_token(http.get("/documents/new").body)
      gone = http.post_form("/documents/#{doc['id']}", "_method" => "delete", "authenticity_token" => token)
      assert_equal 204, gone.status, gone.head
    ensure
      File.unlink(path) if path && File.exist?(path)
    end

    # send_file(Rails.root.join(...)): a Pathname. The server's file path
    # answers with Content-Length; a chunked answer is the each-fallback.
    def test_send_file_pathname_takes_the_file_path
      res = client.get("/download")
      assert_equal 200, res.status, res.head
      expected = JSON.parse(client.get("/download/info").body)
      assert_equal expected["bytes"].to_s, res["content-length"], "no Content-Length: not the sendfile path\n#{res.head}"
      refute res.chunked, "chunked: the body was sent by each, not as a file\n#{res.head}"
      assert_equal expected["md5"], Digest::MD5.hexdigest(res.body)
    end

    # /metrics (metrics_bind from config/puma.rb) after DB work: every
    # serval_db_pool_* family, labelled with the pool, size = database.yml's.
    def test_metrics_show_db_pool_figures
      3.times { assert_equal 200, client.get("/db").status }
      metrics = pool_metrics
      assert_equal 200, metrics.status
      %w[size connections busy idle waiting dead].each do |family|
        line = metrics.body.lines.find { |l| l.start_with?("serval_db_pool_#{family}{") }
        assert line, "no serval_db_pool_#{family} sample in /metrics:\n#{metrics.body.lines.grep(/pool/).join}"
        assert_match(/pool="[^"]+"/, line)
      end
      sizes = metrics.body.lines.grep(/\Aserval_db_pool_size\{/).map { |l| l.split.last.to_f }
      assert_equal [db_pool.to_f], sizes.uniq, "pool size should be database.yml's max_connections (#{db_pool})"
      assert_match(/^serval_request_pool_wait_seconds_bucket\{/, metrics.body)
    end

    # The pool-size warning: one line per process when max_threads exceeds
    # the pool, none otherwise.
    def test_pool_size_warning
      client.get("/db") # the app is loaded (lazily in some modes) by now
      if expect_pool_warning?
        lines = server.wait_for_lines(/WARNING: max_threads/, [workers, 1].max)
        assert_operator lines.size, :>=, [workers, 1].max, "no pool-size warning (one per process) with #{threads} threads and a pool of #{db_pool}\n#{server.logs}"
        lines.each { |l| assert_match(/\b#{threads}\b.*\b#{db_pool}\b/, l) }
      else
        assert_empty server.lines_matching(/WARNING: max_threads/), "a warning with threads == pool"
      end
    end

    # Rails logs to STDOUT in production; through a pipe the request's line
    # must arrive while the server runs, not when it exits.
    def test_stdout_logging_through_a_pipe
      probe = SecureRandom.hex(6)
      assert_equal 200, client.get("/plain?probe=#{probe}").status
      assert server.wait_for(/Started GET "\/plain\?probe=#{probe}"/, timeout: 10)
    end

    # A header whose value is nil: every posts page sets x-build from
    # BUILD_SHA, which is unset outside a container, as real apps do. The
    # page answers 200 with the header empty (Puma writes a nil value as an
    # empty one), or with the value where the mode sets BUILD_SHA.
    def test_nil_header_value_answers_200
      res = client.get("/posts")
      assert_equal 200, res.status, "#{res.head}\n#{res.body[0, 500]}"
      assert_equal [server.env["BUILD_SHA"].to_s], res.all("x-build"), res.head
      assert_includes res.body, "Posts"
    end

    # The other two actions answer (the benchmark uses /plain and /db).
    def test_cpu_and_db_actions
      assert_equal "ok", client.get("/plain").body
      assert_kind_of Array, JSON.parse(client.get("/db").body)
      cpu = JSON.parse(client.get("/cpu?ms=20").body)
      assert_operator cpu["cpu_ms"], :>=, 20
    end

    private

    # /metrics once every pool family is there (a cluster worker's figures
    # arrive with its next check-in), or as it is after 15 s.
    def pool_metrics
      deadline = now + 15
      loop do
        res = HttpClient.new(server.metrics_port).get("/metrics")
        return res if now > deadline || (res.status == 200 && res.body.include?("serval_db_pool_dead{"))

        sleep 0.25
      end
    end

    def next_cable_message(ws)
      loop do
        msg = JSON.parse(ws.read_text(timeout: 10))
        return msg unless msg["type"] == "ping"
      end
    end

    # 1 MiB blocks, each stamped with its index, so reordering shows in the MD5.
    def write_upload_file(path)
      block = SecureRandom.random_bytes(1 << 20)
      File.open(path, "wb") do |f|
        (UPLOAD_BYTES >> 20).times { |i| f.write([i].pack("N") + block.byteslice(4..)) }
      end
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
