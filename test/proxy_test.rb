# frozen_string_literal: true

require "test_helper"
require "json"
require "fileutils"
require "support/subprocess_server"
require "support/real_proxies"
require "serval/prometheus"

# Real nginx and real HAProxy (the Debian packages) in front of a Serval
# subprocess, each stamping X-Request-Start. One Serval thread: a request
# held in the app makes the next one queue in Serval for real, and its
# upstream queue time (proxy stamp -> app) shows in env["serval.timing"],
# the access log (upstream=) and /metrics
# (serval_request_upstream_queue_seconds). The proxy configs are the ones
# docs/deployment.md shows. Skipped when nginx or haproxy is not installed.
class ProxyTest < Minitest::Test
  include Serval::RealProxies
  include Serval::SubprocessHelpers


  # The app: /hold says it is in (FIFO `started`) and waits for the test
  # (FIFO `release`); any other path answers its own timing as JSON.
  APP = <<~RUBY
    require "json"
    run lambda { |env|
      if env["PATH_INFO"] == "/hold"
        File.write(ENV.fetch("HOLD_STARTED"), "in\\n")
        File.read(ENV.fetch("HOLD_RELEASE"))
        [200, { "content-type" => "text/plain" }, ["held\\n"]]
      else
        t = env["serval.timing"]
        body = JSON.generate(upstream_queue: t.upstream_queue, queue: t.queue, stamp: env["HTTP_X_REQUEST_START"])
        [200, { "content-type" => "application/json" }, [body]]
      end
    }
  RUBY

  # docs/deployment.md "nginx", with the test's ports and paths.
  NGINX = <<~CONF
    daemon off;
    worker_processes 1;
    pid %<dir>s/nginx.pid;
    error_log %<dir>s/nginx-error.log;
    events { worker_connections 256; }
    http {
      access_log %<dir>s/nginx-access.log;
      client_body_temp_path %<dir>s/nginx-body;
      proxy_temp_path %<dir>s/nginx-proxy;
      fastcgi_temp_path %<dir>s/nginx-fastcgi;
      uwsgi_temp_path %<dir>s/nginx-uwsgi;
      scgi_temp_path %<dir>s/nginx-scgi;

      upstream serval {
        server 127.0.0.1:%<upstream>d;
        keepalive 16;
        keepalive_timeout 15s;
      }
      server {
        listen 127.0.0.1:%<port>d;
        client_max_body_size 200m;
        location / {
          proxy_pass http://serval;
          proxy_http_version 1.1;
          proxy_set_header Connection "";
          proxy_set_header Host $host;
          proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
          proxy_set_header X-Forwarded-Proto $scheme;
          proxy_set_header X-Request-Start "t=${msec}";
        }
      }
    }
  CONF

  # docs/deployment.md "HAProxy", with the test's ports (the health check
  # line is left out: a check would queue behind /hold too).
  HAPROXY = <<~CONF
    global
      maxconn 1000
    defaults
      mode http
      option forwardfor
      timeout connect 5s
      timeout client 30s
      timeout server 60s
      timeout http-keep-alive 15s
    frontend www
      bind 127.0.0.1:%<port>d
      http-request set-header X-Request-Start t=%%[date(0,ms)]
      default_backend serval
    backend serval
      balance leastconn
      server app1 127.0.0.1:%<upstream>d
  CONF

  def setup
    @procs = []
  end

  def teardown
    @procs.each { |pid| stop_proxy(pid) }
  end

  def test_nginx_stamp_shows_as_upstream_queue
    nginx = tool("nginx")
    with_serval do |serval, dir|
      port = Serval::SubprocessServer.free_port
      conf = File.join(dir, "nginx.conf")
      File.write(conf, format(NGINX, dir: dir, port: port, upstream: serval.port))
      start_proxy([nginx, "-p", dir, "-c", conf, "-e", File.join(dir, "nginx-error.log")], port, dir)
      exercise(serval, port, /\At=\d{10}\.\d{3}\z/)
    end
  end

  def test_haproxy_stamp_shows_as_upstream_queue
    haproxy = tool("haproxy")
    with_serval do |serval, dir|
      port = Serval::SubprocessServer.free_port
      conf = File.join(dir, "haproxy.cfg")
      File.write(conf, format(HAPROXY, port: port, upstream: serval.port))
      start_proxy([haproxy, "-f", conf, "-db"], port, dir)
      exercise(serval, port, /\At=\d{13}\z/)
    end
  end

  # Without a proxy: every request with a stamp is counted in the histogram
  # (not only the sampled ones), a request without one is not, and the
  # access log carries upstream= only when there was a stamp.
  def test_upstream_histogram_and_log_field_in_process
    out = StringIO.new
    log = Serval::LogWriter.new(stdout: out, stderr: StringIO.new)
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
    with_server(app, log_writer: log, timing_sample_rate: 0.0) do |server, port|
      stamp = ((Time.now.to_f - 0.3) * 1e3).round # 300 ms ago, in ms as HAProxy sends it
      raw_request(port, "GET /stamped HTTP/1.1\r\nHost: x\r\nX-Request-Start: t=#{stamp}\r\nConnection: close\r\n\r\n")
      raw_request(port, "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      hist = server.stats[:timing].fetch("request_upstream_queue_seconds")
      assert_equal 1, hist[:count], "only the stamped request"
      assert_operator hist[:sum], :>=, 0.299
      assert_equal 2, server.stats[:timing]["queue_seconds"][:count]
      text = Serval::Prometheus.render(server.stats.slice(:timing))
      assert_includes text, "# TYPE serval_request_upstream_queue_seconds histogram\n"
      assert_includes text, %(serval_request_upstream_queue_seconds_bucket{le="0.25"} 0\n)
      assert_includes text, "serval_request_upstream_queue_seconds_count 1\n"
    end
    with_server(app, log_writer: log, log_requests: true) do |_server, port|
      stamp = format("t=%.3f", Time.now.to_f - 0.05) # nginx's ${msec}
      raw_request(port, "GET /stamped HTTP/1.1\r\nHost: x\r\nX-Request-Start: #{stamp}\r\nConnection: close\r\n\r\n")
      raw_request(port, "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    end
    stamped = out.string.lines.grep(%r{/stamped}).first
    plain = out.string.lines.grep(%r{/plain}).first
    assert_match(/ upstream=\d+\.\d\d$/, stamped)
    assert_operator stamped[/upstream=(\S+)/, 1].to_f, :>=, 49.0
    refute_match(/upstream=/, plain)
  end

  private

  def with_serval
    dir = Dir.mktmpdir("serval-proxy-")
    FileUtils.chmod(0o755, dir) # nginx's workers run as another user when the master is root
    started = File.join(dir, "started")
    release = File.join(dir, "release")
    File.mkfifo(started)
    File.mkfifo(release)
    @release = release
    @started = started
    serval = spawn_server(["-b", "tcp://127.0.0.1:0", "-t", "1:1", "--log-requests",
                           "--metrics-bind", "tcp://127.0.0.1:0"],
                          files: { "config.ru" => APP },
                          env: { "HOLD_STARTED" => started, "HOLD_RELEASE" => release })
    serval.boot
    @metrics_port = serval.wait_for(%r{\* Metrics on http://127\.0\.0\.1:(\d+)/metrics})[1].to_i
    yield serval, dir
  ensure
    FileUtils.rm_rf(dir) if dir && passed?
  end

  # /hold takes Serval's only thread; /fast, sent through the proxy after,
  # waits in Serval's queue until the test releases /hold.
  def exercise(serval, port, stamp_format)
    held = Thread.new { get(port, "/hold") }
    File.read(@started) # the app is in /hold
    fast = Thread.new { get(port, "/fast") }
    seen_queued_at = wait_metric("serval_backlog") { |v| v == 1 }
    released_at = now
    File.write(@release, "go\n")
    assert_equal [200, "held\n"], held.value
    status, body = fast.value
    assert_equal 200, status
    timing = JSON.parse(body)
    up = timing["upstream_queue"]
    queue = timing["queue"]
    waited = released_at - seen_queued_at # /fast was queued in Serval all along

    assert_match stamp_format, timing["stamp"]
    assert_operator queue, :>=, waited, timing
    assert_operator up, :>=, waited, timing
    # the stamp is taken before Serval's queue starts; it has millisecond
    # resolution, truncated (earlier, never later), read on the wall clock
    assert_operator up, :>=, queue - 0.001, timing

    line = serval.wait_for(%r{"GET /fast HTTP/1\.1" 200 .* upstream=(\d+\.\d\d)$})
    assert_equal format("%.2f", up * 1e3), line[1], "access log upstream= (ms)"

    metrics = scrape
    assert_equal 2, metrics["serval_request_upstream_queue_seconds_count"], "/hold and /fast carried a stamp"
    assert_operator metrics["serval_request_upstream_queue_seconds_sum"], :>=, up
    assert_operator metrics["serval_queue_seconds_count"], :>=, 2
  end

  # One request through the proxy; [status, body].
  def get(port, path)
    client = Serval::HttpWire::Client.new(port, timeout: 15)
    res = client.write("GET #{path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n").read_response
    assert_equal :eof, client.wait_close, "closed after the response (connection: close)"
    [res.status, res.body]
  ensure
    client&.close
  end

  # Unlabelled samples of the metrics listener: name => value.
  def scrape
    client = Serval::HttpWire::Client.new(@metrics_port, timeout: 15)
    body = client.write("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").read_response.body
    body.lines.grep_v(/\A#/).filter_map do |line|
      name, value = line.split
      [name, value.include?(".") ? value.to_f : value.to_i] unless name.include?("{")
    end.to_h
  ensure
    client&.close
  end

  # Polls /metrics (another process's state: nothing to wait on) until the
  # block accepts the value; returns the monotonic time it did.
  def wait_metric(name, timeout: 10)
    deadline = now + timeout
    loop do
      value = scrape[name]
      return now if yield(value)
      raise "#{name} is #{value.inspect} after #{timeout}s" if now > deadline

      sleep 0.01
    end
  end

end
