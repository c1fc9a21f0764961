# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require_relative "rack_env_test"

# The env's per-request values go into the template's copy either straight
# through its entry array (:direct, after a layout check at load) or through
# st_foreach_with_replace (:generic). Both must build the same env.
class EnvFillTest < Minitest::Test
  include Serval::HttpWire

  REQUESTS = [
    "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    "GET /p/q?x=1&y=2 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: u\r\nAccept: */*\r\n\r\n",
    "GET /old HTTP/1.0\r\n\r\n", # no Host: HTTP_HOST taken out, SERVER_NAME from the listener
    "GET /old HTTP/1.0\r\nHost: h10\r\n\r\n",
    "POST /f HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc",
    "GET http://abs.example:81/z?q HTTP/1.1\r\nHost: abs.example:81\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
    "OPTIONS * HTTP/1.1\r\nHost: [::1]:9\r\nX-Request-Start: t=1\r\nUpgrade: websocket, h2c\r\n\r\n",
    "DELETE /d HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-A: 2\r\nAccept: a\r\nAccept: b\r\n\r\n"
  ].freeze

  def teardown
    Serval::Native.env_fill = :direct
  end

  def test_layout_check_passes_on_this_ruby
    require "serval/server"
    assert_equal :direct, Serval::Native.env_fill, "the entry layout check failed: the generic pass is in use"
    assert_equal :generic, (Serval::Native.env_fill = :generic) && Serval::Native.env_fill
  end

  def test_both_fills_build_the_same_env
    assert_equal envs_for(:generic), envs_for(:direct)
  end

  # Request#env with templates of other layouts, in turn (the direct fill
  # remembers where the last template held each key, and must notice another
  # one): every env has the request's values under every key, both fills.
  def test_templates_of_other_layouts_in_turn
    require "serval/server"
    keys = Serval::RequestHandler::ALWAYS_SET
    templates = [
      ({ "x-first" => 1, "x-second" => 2 }.merge(keys.reverse.to_h { |k| [k, nil] })).freeze,
      { "rack.input" => nil }.freeze,
      keys.to_h { |k| [k, nil] }.merge("x-last" => 3).freeze,
      keys.each_slice(2).flat_map { |a, b| [([b, nil] if b), [a, nil], ["x-#{a}", 0]].compact }.to_h.freeze,
      keys.to_h { |k| [k, nil] }.merge("x-first" => 1, "x-second" => 2).freeze # as many entries as the first
    ]
    %i[direct generic].each do |mode|
      Serval::Native.env_fill = mode
      seen = Queue.new
      probe = lambda do |env|
        request = env["rack.hijack"]
        seen << [0, 1, 0, 2, 3, 1, 3, 0, 4, 0, 4].map { |i| [i, request.env(templates[i])] }
        [200, { "content-length" => "2" }, ["ok"]]
      end
      with_server(probe, lint: false) do |_server, port|
        assert_equal 200, http(port, "PUT /t?u=2 HTTP/1.1\r\nHost: t.test:82\r\nX-B: y\r\n\r\n").status
        seen.pop.each do |i, env|
          assert_equal ["PUT", "/t", "u=2", "/t?u=2", "HTTP/1.1", "t.test", "82", "t.test:82", "y", "127.0.0.1"],
                       env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_PROTOCOL",
                                     "SERVER_NAME", "SERVER_PORT", "HTTP_HOST", "HTTP_X_B", "REMOTE_ADDR"), "#{mode} #{i}"
          assert_equal [[], []], env.values_at("rack.response_finished", "rack.after_reply"), "#{mode} #{i}"
          templates[i].each { |k, v| assert_equal v, env[k], "#{mode} #{i} #{k}" unless keys.include?(k) }
          assert_equal (templates[i].keys | keys | %w[HTTP_X_B]).sort, env.keys.sort, "#{mode} #{i}"
        end
      end
    end
  end

  # The same template object rebuilt in place (a key moved to the end,
  # rehashed: as many entries, other places): the remembered places are
  # checked against the keys before they are used.
  def test_a_template_rebuilt_in_place
    require "serval/server"
    keys = Serval::RequestHandler::ALWAYS_SET
    %i[direct generic].each do |mode|
      Serval::Native.env_fill = mode
      seen = Queue.new
      probe = lambda do |env|
        request = env["rack.hijack"]
        template = { "x-a" => 1 }.merge(keys.to_h { |k| [k, nil] })
        first = request.env(template)
        template.delete("x-a")
        template["x-a"] = 1
        template.rehash
        seen << [first, request.env(template)]
        [200, { "content-length" => "2" }, ["ok"]]
      end
      with_server(probe, lint: false) do |_server, port|
        assert_equal 200, http(port, "GET /r?s=1 HTTP/1.1\r\nHost: r.test\r\n\r\n").status
        seen.pop.each do |env|
          assert_equal ["GET", "/r", "s=1", "/r?s=1", "r.test", 1], env.values_at("REQUEST_METHOD", "PATH_INFO",
                                                                                  "QUERY_STRING", "REQUEST_URI", "HTTP_HOST", "x-a"), mode
        end
      end
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
      methods.each do |m|
        res = http(port, "#{m} /x HTTP/1.1\r\nHost: h\r\n\r\n", head_request: m == "HEAD")
        assert_equal 200, res.status, m
        assert_equal [m, true], seen.pop
      end
    end
  end

  private

  # The env of every request in REQUESTS, as plain data: String values as
  # they are (with frozen-ness), the others by class.
  def envs_for(mode)
    require "serval/server"
    Serval::Native.env_fill = mode
    assert_equal mode, Serval::Native.env_fill
    seen = Queue.new
    app = lambda do |env|
      seen << env.to_h { |k, v| [k, v.is_a?(String) ? [v, v.frozen?] : v.class.name] }.sort.to_h
      [200, { "content-length" => "2" }, ["ok"]]
    end
    with_server(app, lint: false, timing: false) do |_server, port|
      REQUESTS.map do |req|
        res = http(port, req)
        assert_equal 200, res.status, req
        # the listener's port (no Host) differs between the two servers
        seen.pop.transform_values { |v| v == [port.to_s, true] ? :listener_port : v }
      end
    end
  end
end

# Every RackEnvTest test again with the generic fill.
class RackEnvGenericFillTest < RackEnvTest
  def setup
    super
    Serval::Native.env_fill = :generic
  end

  def teardown
    Serval::Native.env_fill = :direct
    super
  end
end
