# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "rack"
require "rack/lint"

# The Rack env Serval builds, key by key, checked against the Rack 3 SPEC.
# The env is captured before Rack::Lint wraps rack.input/rack.errors, and the
# app still runs inside Rack::Lint, so every request here is also linted.
class RackEnvTest < Minitest::Test
  include Serval::HttpWire

  # Yields port and a Queue receiving [env snapshot, body read from rack.input].
  def with_env_capture(**opts)
    envs = Queue.new
    inner = lambda do |env|
      input = env["rack.input"].read
      [200, { "content-type" => "text/plain" }, ["read #{input.bytesize}"]].tap { envs << [@snapshot, input] }
    end
    linted = Rack::Lint.new(inner)
    capture = lambda do |env|
      @snapshot = env.dup
      linted.call(env)
    end
    with_server(capture, lint: false, **opts) { |server, port| yield port, envs, server }
  end

  def test_get_with_query_has_every_spec_key
    with_env_capture(timing_sample_rate: 1.0) do |port, envs|
      res = http(port, "GET /a/b%20c?x=1&y=%2F HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t\r\n" \
                       "Accept: */*\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status, res.body
      env, input = envs.pop

      assert_equal "GET", env["REQUEST_METHOD"]
      assert_equal "", env["SCRIPT_NAME"]
      assert_equal "/a/b%20c", env["PATH_INFO"] # not unescaped (SPEC: as sent)
      assert_equal "x=1&y=%2F", env["QUERY_STRING"]
      assert_equal "/a/b%20c?x=1&y=%2F", env["REQUEST_URI"]
      assert_equal "example.com", env["SERVER_NAME"]
      assert_equal "8080", env["SERVER_PORT"]
      assert_equal "HTTP/1.1", env["SERVER_PROTOCOL"]
      assert_equal "127.0.0.1", env["REMOTE_ADDR"]
      assert_match(/\AServal\/\d/, env["SERVER_SOFTWARE"])
      assert_equal "example.com:8080", env["HTTP_HOST"]
      assert_equal "t", env["HTTP_USER_AGENT"]
      assert_equal "*/*", env["HTTP_ACCEPT"]
      assert_equal "close", env["HTTP_CONNECTION"]
      refute env.key?("CONTENT_LENGTH"), "no body: no CONTENT_LENGTH"
      refute env.key?("CONTENT_TYPE")

      assert_equal "http", env["rack.url_scheme"]
      assert_equal true, env["rack.hijack?"]
      assert_respond_to env["rack.hijack"], :call
      assert_equal true, env["rack.multithread"]
      assert_equal false, env["rack.multiprocess"]
      assert_equal false, env["rack.run_once"]
      assert_equal [], env["rack.response_finished"]
      assert_equal [], env["rack.after_reply"]
      refute env.key?("rack.early_hints"), "early_hints is off by default"
      refute env.key?("rack.protocol"), "no Upgrade header: no rack.protocol"
      refute env.key?("rack.version"), "Rack 3 has no rack.version" if Rack.release.start_with?("3")
      %i[puts write flush].each { |m| assert_respond_to env["rack.errors"], m }
      assert_equal "", input
      assert_equal Encoding::BINARY, input.encoding
      %w[REQUEST_METHOD SCRIPT_NAME PATH_INFO QUERY_STRING SERVER_NAME SERVER_PORT SERVER_PROTOCOL].each do |k|
        assert_kind_of String, env[k], k
      end

      expected = %w[REQUEST_METHOD SCRIPT_NAME PATH_INFO QUERY_STRING REQUEST_URI SERVER_NAME SERVER_PORT
                    SERVER_PROTOCOL SERVER_SOFTWARE REMOTE_ADDR HTTP_HOST HTTP_USER_AGENT HTTP_ACCEPT
                    HTTP_CONNECTION rack.url_scheme rack.input rack.errors rack.hijack? rack.hijack
                    rack.multithread rack.multiprocess rack.run_once rack.response_finished rack.after_reply
                    serval.timing]
      assert_equal expected.sort, env.keys.sort
    end
  end

  def test_post_body_sets_content_type_and_length_without_http_prefix
    with_env_capture do |port, envs|
      res = http(port, "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Type: application/x-www-form-urlencoded\r\n" \
                       "Content-Length: 11\r\nConnection: close\r\n\r\nhello=world")
      assert_equal 200, res.status
      assert_equal "read 11", res.body
      env, input = envs.pop
      assert_equal "POST", env["REQUEST_METHOD"]
      assert_equal "application/x-www-form-urlencoded", env["CONTENT_TYPE"]
      assert_equal "11", env["CONTENT_LENGTH"]
      refute env.key?("HTTP_CONTENT_TYPE")
      refute env.key?("HTTP_CONTENT_LENGTH")
      assert_equal "hello=world", input
      assert_equal Encoding::BINARY, input.encoding
    end
  end

  def test_chunked_post_body_is_decoded_into_rack_input
    with_env_capture do |port, envs|
      res = http(port, "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" \
                       "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
      assert_equal 200, res.status
      env, input = envs.pop
      assert_equal "hello world", input
      refute env.key?("HTTP_CONTENT_LENGTH")
      assert(!env.key?("CONTENT_LENGTH") || env["CONTENT_LENGTH"] == "11", env["CONTENT_LENGTH"].inspect)
    end
  end

  # A body over body_spill goes to a temp file; rack.input reads it all.
  def test_large_body_spilled_to_a_file_is_read_back
    body = Random.new(7).bytes(300_000)
    with_env_capture(body_spill: 4096) do |port, envs|
      res = http(port, "PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n#{body}")
      assert_equal 200, res.status
      env, input = envs.pop
      assert_equal body.bytesize.to_s, env["CONTENT_LENGTH"]
      assert_equal body, input
    end
  end

  # The body arrives in later reads than the head (no spill): the head the
  # env is built from must still be intact.
  def test_body_arriving_after_the_head_keeps_the_request_head_intact
    body = "b" * 100_000
    with_env_capture do |port, envs|
      client = connect(port)
      client.write("POST /later?q=1 HTTP/1.1\r\nHost: h\r\nX-Kept: yes\r\nContent-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n")
      client.write(body)
      res = client.read_response
      assert_equal 200, res.status, res.body
      env, input = envs.pop
      assert_equal ["POST", "/later", "q=1", "yes"], env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_X_KEPT")
      assert_equal body, input
    end
  end

  def test_absolute_form_target
    with_env_capture do |port, envs|
      res = http(port, "GET http://other.example:81/p/q?z=9 HTTP/1.1\r\nHost: other.example:81\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status
      env, = envs.pop
      assert_equal "/p/q", env["PATH_INFO"]
      assert_equal "z=9", env["QUERY_STRING"]
      assert_equal "other.example", env["SERVER_NAME"]
      assert_equal "81", env["SERVER_PORT"]
      assert_equal "other.example:81", env["HTTP_HOST"]
    end
  end

  def test_http10_without_host_takes_server_name_and_port_from_the_listener
    with_env_capture do |port, envs|
      res = http(port, "GET /old HTTP/1.0\r\n\r\n")
      assert_equal 200, res.status
      env, = envs.pop
      assert_equal "HTTP/1.0", env["SERVER_PROTOCOL"]
      assert_equal "127.0.0.1", env["SERVER_NAME"]
      assert_equal port.to_s, env["SERVER_PORT"]
      refute env.key?("HTTP_HOST")
      assert_equal "", env["QUERY_STRING"]
    end
  end

  def test_host_without_port_gives_port_80_and_ipv6_literal_host
    with_env_capture do |port, envs|
      assert_equal 200, http(port, "GET / HTTP/1.1\r\nHost: example.org\r\nConnection: close\r\n\r\n").status
      env, = envs.pop
      assert_equal ["example.org", "80"], env.values_at("SERVER_NAME", "SERVER_PORT")

      assert_equal 200, http(port, "GET / HTTP/1.1\r\nHost: [::1]:9000\r\nConnection: close\r\n\r\n").status
      env, = envs.pop
      assert_equal ["[::1]", "9000"], env.values_at("SERVER_NAME", "SERVER_PORT")
    end
  end

  def test_duplicate_headers_are_joined_and_cookies_with_semicolons
    with_env_capture do |port, envs|
      res = http(port, "GET / HTTP/1.1\r\nHost: h\r\nX-Multi: a\r\nAccept: text/html\r\nX-Multi: b\r\n" \
                       "Cookie: a=1\r\nCookie: b=2\r\nx-multi: c\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status
      env, = envs.pop
      assert_equal "a, b, c", env["HTTP_X_MULTI"]
      assert_equal "a=1; b=2", env["HTTP_COOKIE"]
      assert_equal "text/html", env["HTTP_ACCEPT"]
    end
  end

  # X_Forwarded_For would otherwise alias X-Forwarded-For (both HTTP_X_FORWARDED_FOR).
  def test_header_names_with_underscores_are_dropped
    with_env_capture do |port, envs|
      res = http(port, "GET / HTTP/1.1\r\nHost: h\r\nX_Forwarded_For: 6.6.6.6\r\nX-Forwarded-For: 10.0.0.1\r\n" \
                       "Under_Score: 1\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status
      env, = envs.pop
      assert_equal "10.0.0.1", env["HTTP_X_FORWARDED_FOR"]
      refute env.key?("HTTP_UNDER_SCORE")
      refute(env.keys.any? { |k| k.include?("Under") || k.include?("_Forwarded") })
    end
  end

  def test_rack_protocol_from_upgrade
    with_env_capture do |port, envs|
      res = http(port, "GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket, h2c\r\nConnection: Upgrade, close\r\n\r\n")
      assert_equal 200, res.status
      env, = envs.pop
      assert_equal %w[websocket h2c], env["rack.protocol"]
      assert_equal "websocket, h2c", env["HTTP_UPGRADE"]
    end
  end

  # Each request on a keep-alive connection gets a fresh env: nothing from
  # the previous request's headers or body leaks into the next one.
  def test_keep_alive_requests_get_fresh_envs
    with_env_capture do |port, envs|
      client = connect(port)
      client.write("POST /one?a=1 HTTP/1.1\r\nHost: h\r\nX-First: 1\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc")
      assert_equal "read 3", client.read_response.body
      client.write("GET /two HTTP/1.1\r\nHost: h\r\n\r\n")
      assert_equal "read 0", client.read_response.body
      first, first_input = envs.pop
      second, second_input = envs.pop
      assert_equal ["/one", "a=1", "1", "abc"], [first["PATH_INFO"], first["QUERY_STRING"], first["HTTP_X_FIRST"], first_input]
      assert_equal ["/two", "", ""], [second["PATH_INFO"], second["QUERY_STRING"], second_input]
      refute second.key?("HTTP_X_FIRST")
      refute second.key?("CONTENT_TYPE")
      refute second.key?("CONTENT_LENGTH")
      refute_same first["rack.response_finished"], second["rack.response_finished"]
    end
  end

  # REMOTE_ADDR, SERVER_NAME, SERVER_PORT, HTTP_HOST and an empty
  # QUERY_STRING repeat request after request: frozen Strings shared between
  # requests (ext/serval/env.c, its string cache), so no request can change another's.
  # Everything an app may rewrite in place (PATH_INFO, a query, other
  # headers) is a fresh String of its own, every time.
  def test_repeated_values_are_shared_frozen_and_the_rest_fresh
    with_env_capture do |port, envs|
      client = connect(port)
      2.times do
        client.write("GET /same HTTP/1.1\r\nHost: shared.example:8080\r\nX-Own: v\r\n\r\n")
        assert_equal 200, client.read_response.status
      end
      client.write("GET /same?q=1 HTTP/1.1\r\nHost: shared.example:8080\r\n\r\n")
      assert_equal 200, client.read_response.status
      first, = envs.pop
      second, = envs.pop
      third, = envs.pop
      %w[REMOTE_ADDR SERVER_NAME SERVER_PORT HTTP_HOST QUERY_STRING].each do |key|
        assert first[key].frozen?, "#{key} frozen"
        assert_same first[key], second[key], key
      end
      assert_equal ["shared.example", "8080", "shared.example:8080", ""],
                   first.values_at("SERVER_NAME", "SERVER_PORT", "HTTP_HOST", "QUERY_STRING")
      %w[PATH_INFO REQUEST_URI HTTP_X_OWN].each do |key|
        refute first[key].frozen?, "#{key} unfrozen"
        refute_same first[key], second[key], key
      end
      refute_same first["PATH_INFO"], first["REQUEST_URI"]
      refute third["QUERY_STRING"].frozen?
      assert_equal "q=1", third["QUERY_STRING"]
      [first, third].each { |env| assert_equal Encoding::BINARY, env["SERVER_NAME"].encoding }
    end
  end

  # The table of shared values holds a bounded number of short Strings: many
  # different hosts (colliding entries replace each other) and a host longer
  # than the table keeps each get their own, right values.
  def test_many_and_long_hosts_get_their_own_values
    with_env_capture do |port, envs|
      client = connect(port)
      hosts = (1..300).map { |i| "h#{i}.example:#{1000 + i}" } << "#{'l' * 200}.example:9"
      hosts.each do |host|
        client.write("GET / HTTP/1.1\r\nHost: #{host}\r\n\r\n")
        assert_equal 200, client.read_response.status
      end
      hosts.each do |host|
        env, = envs.pop
        name, port_s = host.split(":")
        assert_equal [host, name, port_s], env.values_at("HTTP_HOST", "SERVER_NAME", "SERVER_PORT")
        assert env["HTTP_HOST"].frozen?
      end
    end
  end

  def test_rack_errors_and_input_behave_like_the_spec_says
    seen = Queue.new
    app = lambda do |env|
      env["rack.errors"].puts("logged from the app")
      env["rack.errors"].write("more\n")
      env["rack.errors"].flush
      input = env["rack.input"]
      seen << [input.read(2), input.read(100), input.read(1), input.read]
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    errors = StringIO.new
    saved = $stderr
    $stderr = errors # the env template takes $stderr when the server is built
    with_server(app) do |_server, port|
      $stderr = saved
      res = http(port, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
      assert_equal 200, res.status, res.body
      assert_equal ["he", "llo", nil, ""], seen.pop
    end
    assert_equal "logged from the app\nmore\n", errors.string
  ensure
    $stderr = saved
  end

  # A request without a body shares one stateless empty rack.input (no
  # StringIO per request): it reads as an IO at its end, under Rack::Lint,
  # and what one request does to it (read, close) never shows in the next.
  def test_bodiless_requests_read_an_empty_input_that_keeps_no_state
    seen = Queue.new
    inner = lambda do |env|
      input = env["rack.input"]
      buffer = +"stale"
      lines = []
      input.each { |line| lines << line }
      seen << [input.read, input.read(0), input.read(3), input.read(3, buffer), buffer, input.gets,
               lines, input.read.encoding]
      input.close
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(Rack::Lint.new(inner), lint: false) do |_server, port|
      2.times do
        res = http(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert_equal 200, res.status, res.body
        assert_equal ["", "", nil, nil, "", nil, [], Encoding::BINARY], seen.pop
      end
    end
  end

  # What StringIO answered before (rack.input was a read-only StringIO over
  # "") still answers the same on the shared empty input.
  def test_bodiless_input_answers_what_a_read_only_empty_stringio_did
    seen = Queue.new
    app = lambda do |env|
      input = env["rack.input"]
      seen << [input.string, input.binmode.equal?(input) || input.binmode.is_a?(StringIO), input.tell,
               input.each_line.to_a, input.getc, input.length, input.respond_to?(:string),
               input.respond_to?(:no_such_method)]
      begin
        input.write("x")
        seen << :wrote
      rescue IOError
        seen << :read_only
      end
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
    with_server(app, lint: false) do |_server, port|
      res = http(port, "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
      assert_equal 200, res.status, res.body
      assert_equal ["", true, 0, [], nil, 0, true, false], seen.pop
      assert_equal :read_only, seen.pop
    end
  end
end
