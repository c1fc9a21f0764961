# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require_relative "rack_env_test"

# ext/serval/env.c builds an env from a copy of the template either :plain
# (every per-request key set on the copy) or :prepared (the copy of a base
# that already holds a client's repeating values, SERVER_NAME, REMOTE_ADDR
# and the like; the default). Both must build the same env: keys in the same
# order, the same values, frozen-ness and encodings.
class EnvFillTest < Minitest::Test
  include Serval::HttpWire

  MODES = %i[prepared plain].freeze

  REQUESTS = [
    "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    "GET /p/q?x=1&y=2 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: u\r\nAccept: */*\r\n\r\n",
    "GET /old HTTP/1.0\r\n\r\n", # no Host: HTTP_HOST taken out, SERVER_NAME from the listener
    "GET /old HTTP/1.0\r\nHost: h10\r\n\r\n",
    "POST /f HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc",
    "POST /f HTTP/1.1\r\nHost: h\r\nContent-Type: text/a\r\nContent-Type: text/b\r\nContent-Length: 3\r\n\r\nabc",
    "GET http://abs.example:81/z?q HTTP/1.1\r\nHost: abs.example:81\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
    "OPTIONS * HTTP/1.1\r\nHost: [::1]:9\r\nX-Request-Start: t=1\r\nUpgrade: websocket, h2c\r\n\r\n",
    "DELETE /d HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-A: 2\r\nAccept: a\r\nAccept: b\r\nx-a: 3\r\n\r\n",
    "PROPFIND /w HTTP/1.1\r\nHost: h:\r\nX-Weird.Name~!: v\r\nX_Under: no\r\nA: 1\r\nX-9: 9\r\nVIA: 1\r\nvia: 2\r\n\r\n",
    "GET /u HTTP/1.1\r\nHost: [::1]\r\nX-Utf: \xC3\xA9\r\nX-Empty:\r\nX-Empty: e\r\n\r\n".b,
    "GET /h HTTP/1.1\r\nHost: h\r\nX-#{'n' * 300}: long\r\n#{(1..40).map { |i| "X-H#{i}: #{i}\r\n" }.join}\r\n"
  ].freeze

  def teardown
    Serval::Native.env_fill = :prepared
  end

  def test_prepared_is_the_default_and_plain_can_be_picked
    require "serval/server"
    assert_equal :prepared, Serval::Native.env_fill
    assert_equal :plain, (Serval::Native.env_fill = :plain) && Serval::Native.env_fill
    assert_equal :prepared, (Serval::Native.env_fill = :prepared) && Serval::Native.env_fill
  end

  # Every request three times: the first notes the client's values, the
  # second makes a base from them and the third copies it.
  def test_both_fills_build_the_same_env
    prepared = envs_for(:prepared)
    plain = envs_for(:plain)
    assert_equal plain.size, prepared.size
    plain.zip(prepared).each_with_index { |(a, b), i| assert_equal a, b, REQUESTS[i / 3].lines.first }
    prepared.each_slice(3) { |a, b, c| assert_equal [a, a], [b, c] }
  end

  # A client's requests repeat the same field names with new values: from
  # its second request on, the env is a copy of a base with every value of
  # the request set in place (Native.env_base_copies counts them). A request
  # with another set of names, or more than the bases' 32 fields, is built
  # the plain way; the envs match the plain fill's in every case.
  def test_a_base_copy_takes_every_value_of_its_request
    shape = ->(i) { "GET /a#{i}?q=#{i} HTTP/1.1\r\nHost: h\r\nUser-Agent: ua#{i}\r\nCookie: c=#{i}\r\nCookie: d=#{i}\r\n\r\n" }
    other = "GET /b HTTP/1.1\r\nHost: h\r\nUser-Agent: ua\r\nAccept: x\r\n\r\n"
    many = "GET /m HTTP/1.1\r\nHost: h\r\n#{(1..33).map { |i| "X-M#{i}: #{i}\r\n" }.join}\r\n"
    # (the bases are a direct-mapped table: `other` may take the shape's slot,
    # so the shape's next request may be a first sight again; the one after is a copy)
    requests = (1..5).map(&shape) + [other, many, many, many, shape.call(6), shape.call(7)]
    envs = MODES.to_h do |mode|
      Serval::Native.env_fill = mode
      copies = []
      list = with_env_queue do |port, seen|
        requests.map do |req|
          before = Serval::Native.env_base_copies
          assert_equal 200, http(port, req).status
          env = seen.pop
          copies << Serval::Native.env_base_copies - before
          env.map { |k, v| [k, k == "rack.hijack" ? v.class : v] } # a Request of each server
        end
      end
      [mode, [list, copies]]
    end
    copies = envs[:prepared][1]
    assert_equal [0, 1, 1, 1, 1, 0, 0, 0, 0], copies.first(9), "copies of a base, request by request"
    assert_includes [0, 1], copies[9]
    assert_equal 1, copies[10], "the shape again after another one"
    assert_equal [0] * requests.size, envs[:plain][1]
    assert_equal envs[:plain][0], envs[:prepared][0]
    envs[:prepared][0].first(5).each_with_index do |pairs, k|
      env = pairs.to_h
      i = k + 1
      assert_equal ["/a#{i}", "q=#{i}", "/a#{i}?q=#{i}", "ua#{i}", "c=#{i}; d=#{i}"],
                   env.values_at("PATH_INFO", "QUERY_STRING", "REQUEST_URI", "HTTP_USER_AGENT", "HTTP_COOKIE")
    end
  end

  # An env the app may hand to long-lived objects (Rails keeps the request in
  # thread-local state) must keep its write barrier: an unprotected Hash that
  # an old object points to stays uncollectible until the next major GC, with
  # everything it holds (bench/NOTES.md "Session 26": a major GC every few
  # seconds on a real app). ObjectSpace.dump shows the flag.
  def test_every_env_keeps_its_write_barrier
    require "objspace"
    require "json"
    req = "GET /w HTTP/1.1\r\nHost: h\r\nUser-Agent: ua\r\nAccept: */*\r\n\r\n"
    MODES.each do |mode|
      Serval::Native.env_fill = mode
      before = Serval::Native.env_base_copies
      with_env_queue do |port, seen|
        3.times do |i|
          assert_equal 200, http(port, req).status
          flags = JSON.parse(ObjectSpace.dump(seen.pop))["flags"] || {}
          assert flags["wb_protected"], "#{mode} env of request #{i + 1} lost its write barrier: #{flags.inspect}"
        end
      end
      assert_operator Serval::Native.env_base_copies - before, :>=, 1, "a base copy was checked" if mode == :prepared
    end
  end

  # What the fields give, pinned (the rest of the env: RackEnvTest).
  def test_unusual_and_repeated_fields
    with_env_queue do |port, seen|
      REQUESTS.values_at(5, 8, 9, 10, 11).each { |req| assert_equal 200, http(port, req).status, req }
      ctype, dup, weird, utf, many = Array.new(5) { seen.pop }
      assert_equal "text/a", ctype["CONTENT_TYPE"], "a repeated Content-Type: the first"
      assert_equal "3", ctype["CONTENT_LENGTH"]
      assert_equal ["1, 2, 3", "a, b"], dup.values_at("HTTP_X_A", "HTTP_ACCEPT")
      assert_equal ["v", "1", "9", "1, 2", "h", "80"],
                   weird.values_at("HTTP_X_WEIRD.NAME~!", "HTTP_A", "HTTP_X_9", "HTTP_VIA", "SERVER_NAME", "SERVER_PORT")
      refute weird.key?("HTTP_X_UNDER")
      assert_equal ["é".b, ", e", "[::1]", "80"], utf.values_at("HTTP_X_UTF", "HTTP_X_EMPTY", "SERVER_NAME", "SERVER_PORT")
      assert_equal Encoding::BINARY, utf["HTTP_X_UTF"].encoding
      assert_equal "long", many["HTTP_X_#{'N' * 300}"]
      assert_equal (1..40).map(&:to_s), (1..40).map { |i| many["HTTP_X_H#{i}"] }
      [dup, weird, many].each do |env|
        env.each_key { |k| assert [k.frozen?, k.encoding] == [true, Encoding::UTF_8], k if k.start_with?("HTTP_") }
      end
    end
  end

  # Common names in any case find their key (they are matched eight bytes a
  # step); a name one byte away from a common one gets its own.
  def test_common_names_in_any_case
    req = "GET / HTTP/1.1\r\nHost: h\r\nACCEPT-ENCODING: a\r\nuser-AGENT: u\r\nX-Forwarded-PROTO: p\r\n" \
          "If-Modified-SINCE: i\r\ncontent-TYPE: t/t\r\nAccept.Encoding: dot\r\nX-Forwarded-Prot0: z\r\n" \
          "user-agenT: v\r\nTE: te\r\n\r\n"
    with_env_queue do |port, seen|
      2.times do
        assert_equal 200, http(port, req).status
        env = seen.pop
        assert_equal ["a", "u, v", "p", "i", "t/t", "dot", "z", "te"],
                     env.values_at("HTTP_ACCEPT_ENCODING", "HTTP_USER_AGENT", "HTTP_X_FORWARDED_PROTO", "HTTP_IF_MODIFIED_SINCE",
                                   "CONTENT_TYPE", "HTTP_ACCEPT.ENCODING", "HTTP_X_FORWARDED_PROT0", "HTTP_TE")
        refute env.key?("HTTP_CONTENT_TYPE")
      end
    end
  end

  # The most fields a request may carry (max_headers' ceiling, 256), all of
  # one name or all different: joined in order, or each under its key.
  def test_the_most_fields_of_one_name_or_all_different
    same = "GET / HTTP/1.1\r\nHost: h\r\n#{(1..255).map { |i| "X-S: #{i}\r\n" }.join}\r\n"
    different = "GET / HTTP/1.1\r\nHost: h\r\n#{(1..255).map { |i| "X-D#{i}: #{i}\r\n" }.join}\r\n"
    MODES.each do |mode|
      Serval::Native.env_fill = mode
      with_env_queue(max_headers: 256) do |port, seen|
        2.times do
          assert_equal 200, http(port, same).status
          assert_equal (1..255).to_a.join(", "), seen.pop["HTTP_X_S"], mode
          assert_equal 200, http(port, different).status
          env = seen.pop
          assert_equal (1..255).map(&:to_s), (1..255).map { |i| env["HTTP_X_D#{i}"] }, mode
        end
      end
    end
  end

  # A field whose key the template holds replaces the template's value (a
  # repeat joins onto the request's own String); the template is unchanged.
  def test_a_field_replaces_a_template_value
    require "serval/server"
    keys = Serval::RequestHandler::ALWAYS_SET
    MODES.each do |mode|
      Serval::Native.env_fill = mode
      templates = [keys.to_h { |k| [k, nil] }.merge("HTTP_X_T" => "tmpl", "HTTP_X_NIL" => nil, "CONTENT_TYPE" => "t/t"),
                   { "HTTP_X_T" => +"tmpl", "HTTP_X_NIL" => nil, "CONTENT_TYPE" => "t/t" }]
      templates[0].freeze
      seen = Queue.new
      probe = lambda do |env|
        request = env["rack.hijack"]
        seen << templates.flat_map { |t| Array.new(3) { request.env(t) } }
        [200, { "content-length" => "2" }, ["ok"]]
      end
      with_server(probe, lint: false) do |_server, port|
        assert_equal 200, http(port, "GET / HTTP/1.1\r\nHost: h\r\nX-T: a\r\nX-T: b\r\nX-Nil: n\r\n" \
                                     "Content-Type: a/b\r\nContent-Length: 0\r\n\r\n").status
        seen.pop.each do |env|
          assert_equal ["a, b", "n", "a/b", "0", "h"], env.values_at("HTTP_X_T", "HTTP_X_NIL", "CONTENT_TYPE",
                                                                      "CONTENT_LENGTH", "HTTP_HOST"), mode
        end
      end
      templates.each { |t| assert_equal ["tmpl", nil, "t/t"], t.values_at("HTTP_X_T", "HTTP_X_NIL", "CONTENT_TYPE") }
    end
  end

  # Request#env with templates of other layouts, in turn (a base belongs to
  # one template; a template without the per-request keys gets none): every
  # env has the request's values under every key, both fills.
  def test_templates_of_other_layouts_in_turn
    require "serval/server"
    keys = Serval::RequestHandler::ALWAYS_SET
    templates = [
      ({ "x-first" => 1, "x-second" => 2 }.merge(keys.reverse.to_h { |k| [k, nil] })).freeze,
      { "rack.input" => nil }.freeze,
      keys.to_h { |k| [k, nil] }.merge("x-last" => 3).freeze,
      keys.each_slice(2).flat_map { |a, b| [([b, nil] if b), [a, nil], ["x-#{a}", 0]].compact }.to_h.freeze,
      keys.to_h { |k| [k, nil] }.merge("x-first" => 1, "x-second" => 2).freeze, # as many entries as the first
      keys.reject { |k| k.start_with?("SERVER_") }.to_h { |k| [k, nil] }.freeze, # without keys a base sets
      keys.reject { |k| k == "PATH_INFO" }.to_h { |k| [k, nil] }.freeze, # without a per-request key
      keys.to_h { |k| [k, nil] } # not frozen: never a base
    ]
    order = [0, 1, 0, 2, 3, 1, 3, 0, 4, 0, 4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 2, 2]
    envs = MODES.to_h do |mode|
      Serval::Native.env_fill = mode
      seen = Queue.new
      probe = lambda do |env|
        request = env["rack.hijack"]
        seen << order.map { |i| [i, request.env(templates[i])] }
        [200, { "content-length" => "2" }, ["ok"]]
      end
      with_server(probe, lint: false) do |_server, port|
        assert_equal 200, http(port, "PUT /t?u=2 HTTP/1.1\r\nHost: t.test:82\r\nX-B: y\r\n\r\n").status
        [mode, seen.pop]
      end
    end
    envs.each do |mode, list|
      list.each do |i, env|
        assert_equal ["PUT", "/t", "u=2", "/t?u=2", "HTTP/1.1", "t.test", "82", "t.test:82", "y", "127.0.0.1"],
                     env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_PROTOCOL",
                                   "SERVER_NAME", "SERVER_PORT", "HTTP_HOST", "HTTP_X_B", "REMOTE_ADDR"), "#{mode} #{i}"
        assert_equal [[], []], env.values_at("rack.response_finished", "rack.after_reply"), "#{mode} #{i}"
        templates[i].each { |k, v| assert_equal v, env[k], "#{mode} #{i} #{k}" unless keys.include?(k) }
        assert_equal (templates[i].keys | keys | %w[HTTP_X_B]).sort, env.keys.sort, "#{mode} #{i}"
      end
    end
    assert_equal envs[:plain].map { |i, env| [i, env.keys] }, envs[:prepared].map { |i, env| [i, env.keys] }, "key order"
  end

  # The same template object rebuilt in place (a key moved to the end,
  # rehashed): the env follows the template as it is now, after the six
  # per-request slots (PATH_INFO, QUERY_STRING, REQUEST_URI, rack.hijack,
  # rack.response_finished, rack.after_reply), which lead every env.
  def test_a_template_rebuilt_in_place
    require "serval/server"
    keys = Serval::RequestHandler::ALWAYS_SET
    MODES.each do |mode|
      Serval::Native.env_fill = mode
      seen = Queue.new
      probe = lambda do |env|
        request = env["rack.hijack"]
        template = { "x-a" => 1 }.merge(keys.to_h { |k| [k, nil] })
        first = Array.new(3) { request.env(template) }
        template.delete("x-a")
        template["x-a"] = 2
        template.rehash
        seen << (first + Array.new(3) { request.env(template) })
        [200, { "content-length" => "2" }, ["ok"]]
      end
      with_server(probe, lint: false) do |_server, port|
        assert_equal 200, http(port, "GET /r?s=1 HTTP/1.1\r\nHost: r.test\r\n\r\n").status
        seen.pop.each_with_index do |env, i|
          assert_equal ["GET", "/r", "s=1", "/r?s=1", "r.test", i < 3 ? 1 : 2],
                       env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "HTTP_HOST", "x-a"), mode
          assert_equal "x-a", env.keys[i < 3 ? 6 : keys.size], mode
        end
      end
    end
  end

  # More clients than the table of bases has entries (32), in turn, each
  # three times in a row (noted, a base made, the base copied): entries
  # replace each other, every env keeps its own request's values.
  def test_more_clients_than_bases_in_turn
    with_env_queue do |port, seen|
      client = connect(port)
      hosts = (1..80).map { |i| "c#{i}.example:#{2000 + i}" }
      methods = %w[GET POST PATCH]
      sent = []
      2.times do |round|
        hosts.each_with_index do |host, i|
          3.times do |again|
            method = methods[i % 3]
            client.write("#{method} /#{i}/#{again}?r=#{round} HTTP/1.1\r\nHost: #{host}\r\nContent-Length: 0\r\n\r\n")
            assert_equal 200, client.read_response.status
            sent << [method, host, "#{i}/#{again}", round]
          end
        end
      end
      sent.each do |method, host, i, round|
        env = seen.pop
        name, port_s = host.split(":")
        assert_equal [method, "/#{i}", "r=#{round}", host, name, port_s],
                     env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_HOST", "SERVER_NAME", "SERVER_PORT")
      end
    ensure
      client&.close
    end
  end

  # REQUEST_METHOD: the common methods come from a table picked by length,
  # any other token is interned as sent.
  def test_request_method_of_every_kind
    methods = %w[GET POST HEAD PUT DELETE PATCH OPTIONS PROPFIND GETS PUTT DELETX TRACE CONNECTX]
    seen = Queue.new
    app = lambda do |env|
      seen << [env["REQUEST_METHOD"], env["REQUEST_METHOD"].frozen?]
      [200, { "content-length" => "2" }, ["ok"]]
    end
    with_server(app, lint: false) do |_server, port|
      (methods * 2).each do |m|
        res = http(port, "#{m} /x HTTP/1.1\r\nHost: h\r\n\r\n", head_request: m == "HEAD")
        assert_equal 200, res.status, m
        assert_equal [m, true], seen.pop
      end
    end
  end

  private

  def with_env_queue(**opts)
    require "serval/server"
    seen = Queue.new
    app = lambda do |env|
      seen << env.dup
      [200, { "content-length" => "2" }, ["ok"]]
    end
    with_server(app, lint: false, timing: false, **opts) { |_server, port| yield port, seen }
  end

  # The env of every request in REQUESTS, three times each, as plain data
  # in the env's order: keys with frozen-ness and encoding, String values
  # as they are (with frozen-ness and encoding), the others by class.
  def envs_for(mode)
    require "serval/server"
    Serval::Native.env_fill = mode
    assert_equal mode, Serval::Native.env_fill
    seen = Queue.new
    app = lambda do |env|
      seen << env.map do |k, v|
        [k, k.frozen?, k.encoding, v.is_a?(String) ? [v, v.frozen?, v.encoding] : v.class.name]
      end
      [200, { "content-length" => "2" }, ["ok"]]
    end
    with_server(app, lint: false, timing: false) do |_server, port|
      (REQUESTS.flat_map { |req| [req] * 3 }).map do |req|
        res = http(port, req)
        assert_equal 200, res.status, req
        # the listener's port (no Host) differs between the two servers
        seen.pop.map { |row| row[3] == [port.to_s, true, Encoding::BINARY] ? row.dup.tap { |r| r[3] = :listener_port } : row }
      end
    end
  end
end

# Every RackEnvTest test again with the plain fill.
class RackEnvPlainFillTest < RackEnvTest
  def setup
    super
    Serval::Native.env_fill = :plain
  end

  def teardown
    Serval::Native.env_fill = :prepared
    super
  end
end
