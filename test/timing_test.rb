# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/http_wire"
require "serval/timing"

# Per-request timing points, on every Ruby: upstream queue parsing, the env
# object, the access-log fields, the stats shape, and the CPU/wall pair.
class TimingTest < Minitest::Test
  include Serval::HttpWire

  UQ = Serval::Timing::UpstreamQueue
  NOW = 1_700_000_000.5

  def assert_upstream(expected, header)
    got = UQ.seconds(header, NOW)
    refute_nil got, header
    assert_in_delta expected, got, 1e-3, header
  end

  def test_upstream_queue_every_format
    assert_upstream 0.25, "t=#{((NOW - 0.25) * 1e6).round}"         # t= microseconds (nginx $msec*1e6, Heroku)
    assert_upstream 0.25, ((NOW - 0.25) * 1e6).round.to_s           # bare microseconds
    assert_upstream 0.25, "t=#{((NOW - 0.25) * 1e3).round}"         # t= milliseconds
    assert_upstream 0.25, ((NOW - 0.25) * 1e3).round.to_s           # bare milliseconds (Heroku router)
    assert_upstream 0.25, format("t=%.3f", NOW - 0.25)               # nginx t=${msec}
    assert_upstream 0.25, format("%.3f", NOW - 0.25)                 # seconds with a fraction
    assert_upstream 0.25, "t=#{((NOW - 0.25) * 1e9).round}"         # nanoseconds
    assert_upstream 0.5, ((NOW - 0.5) * 1e9).round.to_s
    assert_upstream 0.5, (NOW - 0.5).to_i.to_s                       # whole seconds
    assert_upstream 0.25, " t=#{((NOW - 0.25) * 1e6).round}, t=#{(NOW * 1e6).round}" # first proxy wins
  end

  def test_upstream_queue_clamped_and_garbage
    assert_equal 0.0, UQ.seconds("t=#{((NOW + 5) * 1e6).round}", NOW) # stamp in the future: clock skew
    assert_equal UQ::MAX, UQ.seconds("t=#{((NOW - 3600) * 1e3).round}", NOW)
    assert_equal UQ::MAX, UQ.seconds("12", NOW) # a tiny number is not a recent stamp
    assert_nil UQ.seconds("t=", NOW)
    assert_nil UQ.seconds("garbage", NOW)
  end

  def cpu_burn(seconds)
    t0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - t0 < seconds
    x
  end

  # Serves a request that burns ~50 ms of CPU and sleeps ~50 ms; seen gets
  # [timing, the app's own wall-clock time].
  def burn_and_sleep_app(seen)
    lambda do |env|
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      cpu_burn(0.05)
      sleep 0.05
      own = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      env["rack.response_finished"] << ->(e, *) { seen << [e["serval.timing"], own] }
      [200, { "content-type" => "text/plain" }, ["ok"]]
    end
  end

  def test_cpu_and_wall_pair_on_every_ruby
    seen = Queue.new
    with_server(burn_and_sleep_app(seen), max_threads: 1, timing_sample_rate: 1.0) do |_server, port|
      t = own = nil
      5.times do # an attempt whose busy loop lost the CPU to another tenant is repeated
        res = http(port, "GET /work HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert_equal 200, res.status
        t, own = seen.pop
        break if (own - 0.05 - t.cpu).abs < 0.005 # busy wall (own minus the sleep) vs thread CPU
      end
      assert_kind_of Serval::Timing, t
      # The app's own clock bounds wall from below; a busy machine stretches both.
      assert_operator t.wall, :>=, own, t.to_h.inspect
      assert_operator t.wall, :<, own + 0.01, t.to_h.inspect
      assert_in_delta 0.05, t.cpu, 0.0075, t.to_h.inspect
      assert_in_delta t.wall - t.cpu, t.wait, 0.005, t.to_h.inspect unless t.gvl_split?
      assert_operator t.queue, :>=, 0
      assert_operator t.queue, :<, 0.05
      assert_operator t.gc, :>=, 0
      assert_nil t.upstream_queue
    end
  end

  def test_upstream_header_reaches_the_timing
    seen = Queue.new
    app = lambda do |env|
      env["rack.response_finished"] << ->(e, *) { seen << e["serval.timing"] }
      [200, {}, ["ok"]]
    end
    with_server(app, timing_sample_rate: 1.0) do |_server, port|
      stamp = ((Time.now.to_f - 0.2) * 1e6).round
      http(port, "GET / HTTP/1.1\r\nHost: x\r\nX-Request-Start: t=#{stamp}\r\nConnection: close\r\n\r\n")
      assert_in_delta 0.2, seen.pop.upstream_queue, 0.05
    end
  end

  def test_access_log_fields
    out = StringIO.new
    log = Serval::LogWriter.new(stdout: out, stderr: StringIO.new)
    with_server(->(_env) { [200, {}, ["ok"]] }, log_writer: log, log_requests: true,
                                                timing_sample_rate: 1.0) do |_server, port|
      http(port, "GET /logged HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    end
    line = out.string.lines.grep(%r{/logged}).first
    refute_nil line, out.string
    if Serval::Native::GVL.supported?
      assert_match(/ queue=\d+\.\d\d run=\d+\.\d\d idle=\d+\.\d\d stall=\d+\.\d\d$/, line)
    else
      assert_match(/ queue=\d+\.\d\d cpu=\d+\.\d\d wait=\d+\.\d\d$/, line)
    end
  end

  def test_timing_off_leaves_no_trace
    seen = Queue.new
    app = ->(env) { seen << env.key?("serval.timing") && [200, {}, ["ok"]] }
    with_server(app, lint: false, timing: false) do |server, port|
      http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      assert_equal false, seen.pop
      assert_nil server.stats[:timing]
    end
  end

  # With rate 0.0 no request gets a Timing object (nor reads the CPU clock),
  # yet every request is still counted in the histograms.
  def test_sample_rate_zero_still_counts_every_request
    seen = Queue.new
    app = ->(env) { seen << env.key?("serval.timing") && [200, {}, ["ok"]] }
    with_server(app, lint: false, timing_sample_rate: 0.0) do |server, port|
      2.times { http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") }
      assert_equal [false, false], [seen.pop, seen.pop]
      assert_equal 2, server.stats[:timing]["queue_seconds"][:count]
    end
  end

  # With rate 0.5 every second request is sampled (deterministic, not random),
  # and a sampled one carries CPU and GC time.
  def test_sample_rate_half_samples_every_second_request
    seen = Queue.new
    app = lambda do |env|
      t = env["serval.timing"]
      env["rack.response_finished"] << ->(*) { seen << t }
      [200, {}, ["ok"]]
    end
    with_server(app, timing_sample_rate: 0.5, max_threads: 1) do |_server, port|
      4.times { http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") }
      sampled = Array.new(4) { seen.pop }.compact
      assert_equal 2, sampled.size
      sampled.each do |t|
        assert_operator t.cpu, :>=, 0
        assert_operator t.gc, :>=, 0
        assert_operator t.wall, :>, 0
      end
    end
  end

  # timing_sample_cap: with a rate below 1, at most that many requests a
  # second are sampled (the second the request became complete in); 0 lifts
  # the cap; a rate of 1.0 is never capped.
  def test_sample_cap_bounds_the_sampled_requests_a_second
    seen = Queue.new
    app = lambda do |env|
      t = env["serval.timing"]
      env["rack.response_finished"] << ->(*) { seen << !t.nil? }
      [200, {}, ["ok"]]
    end
    { [0.5, 1] => 1..2, [0.5, 0] => 5..5, [1.0, 1] => 10..10 }.each do |(rate, cap), expected|
      with_server(app, timing_sample_rate: rate, timing_sample_cap: cap, max_threads: 1) do |_server, port|
        10.times { http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") }
        sampled = Array.new(10) { seen.pop }.count(true)
        # ten quick requests fall in one second, or two: one sample per second under cap 1
        assert_includes expected, sampled, "rate #{rate}, cap #{cap}"
      end
    end
  ensure
    Serval::Timing.sample_cap = Serval::Configuration::DEFAULTS[:timing_sample_cap]
  end

  def test_stats_shape_for_prometheus
    with_server(->(_env) { [200, {}, ["ok"]] }, timing_sample_rate: 1.0) do |server, port|
      3.times { http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") }
      timing = server.stats[:timing]
      %w[queue_seconds run_seconds idle_seconds stall_seconds].each do |name|
        h = timing.fetch(name)
        assert_equal :histogram, h[:type]
        assert_kind_of String, h[:help]
        assert_equal Float::INFINITY, h[:buckets].last[0]
        assert_equal h[:count], h[:buckets].last[1]
        assert_equal h[:buckets].map(&:last).sort, h[:buckets].map(&:last), "cumulative"
        assert_kind_of Float, h[:sum]
      end
      assert_equal 3, timing["queue_seconds"][:count]
      assert_equal 3, timing["run_seconds"][:count]
      %w[gvl_utilization gvl_waiting_threads gvl_split].each do |name|
        assert_equal :gauge, timing.fetch(name)[:type]
        assert timing[name].key?(:value)
      end
      split = Serval::Native::GVL.supported?
      assert_equal(split ? 1 : 0, timing["gvl_split"][:value])
      assert_equal(split ? 3 : 0, timing["stall_seconds"][:count])
      assert(timing["gvl_waiting_threads"][:value].nan?) unless split
    end
  end

  # Runs the block in a forked child and returns what it returned (Marshal).
  # PoolWait.enable is process-wide and one-way: this process stays without it.
  def in_child
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      result = begin
        [:ok, yield]
      rescue Exception => e
        [:error, e.full_message]
      end
      writer.write(Marshal.dump(result))
      writer.close
      exit!(0)
    end
    writer.close
    status, value = Marshal.load(reader.read)
    flunk("child failed: #{value}") unless status == :ok
    value
  ensure
    reader&.close
    Process.wait(pid) if pid
  end

  # pool_wait on every Ruby: the child turns PoolWait on (what DbPools does
  # once Active Record is loaded) and its app blocks 100 ms between enter and
  # leave, as Active Record's checkout does, then sleeps 50 ms.
  def test_pool_wait_is_its_own_figure
    t, hist, log = in_child do
      Serval::Native::PoolWait.enable
      seen = Queue.new
      out = StringIO.new
      app = lambda do |env|
        Serval::Native::PoolWait.enter
        sleep 0.1
        Serval::Native::PoolWait.leave
        sleep 0.05
        env["rack.response_finished"] << ->(e, *) { seen << e["serval.timing"].to_h }
        [200, {}, ["ok"]]
      end
      with_server(app, log_writer: Serval::LogWriter.new(stdout: out, stderr: StringIO.new),
                       log_requests: true, max_threads: 1) do |server, port|
        http(port, "GET /pooled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        [seen.pop, server.stats[:timing]["request_pool_wait_seconds"], out.string]
      end
    end
    assert_operator t[:pool_wait], :>=, 0.1, t.inspect
    assert_operator t[:pool_wait], :<=, t[:wall] - 0.05, t.inspect
    if t[:run] # GVL hook: the wait is out of idle, and the four add up to wall
      assert_in_delta t[:wall], t[:run] + t[:idle] + t[:stall] + t[:pool_wait], [0.002, t[:wall] * 0.02].max, t.inspect
      assert_operator t[:idle], :>=, 0.045, t.inspect
      assert_operator t[:idle], :<, 0.1, t.inspect
    else # 3.1: out of wait (wall - cpu)
      assert_in_delta t[:wall] - t[:cpu] - t[:pool_wait], t[:wait], 1e-6, t.inspect
      assert_operator t[:wait], :>=, 0.045, t.inspect
      assert_operator t[:wait], :<, 0.1, t.inspect
    end
    line = log.lines.grep(%r{/pooled}).first
    logged = line && line[/ pool_wait=(\d+\.\d\d)$/, 1]
    refute_nil logged, log
    assert_in_delta t[:pool_wait] * 1e3, Float(logged), 0.01
    assert_equal :histogram, hist[:type]
    assert_equal 1, hist[:count]
    assert_in_delta t[:pool_wait], hist[:sum], 1e-9
    assert_equal 0, hist[:buckets].find { |le, _| le == 0.05 }[1], "100 ms is above the 50 ms bucket"
  end

  # Without PoolWait.enable (no Active Record) pool_wait is absent, not 0.
  def test_no_pool_wait_without_active_record
    seen = Queue.new
    app = lambda do |env|
      env["rack.response_finished"] << ->(e, *) { seen << e["serval.timing"] }
      [200, {}, ["ok"]]
    end
    with_server(app, timing_sample_rate: 1.0) do |server, port|
      http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      t = seen.pop
      assert_nil t.pool_wait
      assert t.to_h.key?(:pool_wait)
      refute_match(/pool_wait/, t.log_fields)
      refute server.stats[:timing].key?("request_pool_wait_seconds")
    end
  end

  def test_gvl_trace_on_ruby_without_the_hook
    skip "Ruby #{RUBY_VERSION} has the GVL hook: see gvl_test.rb" if Serval::Native::GVL.supported?
    require "serval/gvl_trace"
    e = assert_raises(NotImplementedError) { Serval::GVLTrace.record(0.1) }
    assert_match(/Ruby 3\.2\+/, e.message)
  end

  # An unsampled request's record lives in its connection; a request whose
  # connection leaves it before #finish (a full hijack; an abort when the
  # client has gone) keeps its timing running until #finish, as a sampled one
  # does: the 50 ms the app sleeps after the hijack, and the 50 ms its body's
  # close sleeps after the abort, are in the idle time.
  def test_timing_outlives_a_hijacked_or_aborted_connection
    skip "needs the GVL hook (Ruby 3.2+)" unless Serval::Native::GVL.supported?
    done = Queue.new
    app = lambda do |env|
      env["rack.response_finished"] << ->(*) { done << env["PATH_INFO"] }
      case env["PATH_INFO"]
      when "/hijack"
        io = env["rack.hijack"].call
        io.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi")
        io.close
        sleep 0.05
        [200, {}, []]
      when "/abort"
        sleep 0.1 # the client is gone by now: the writes below fail
        chunk = "x" * 65_536
        body = Object.new
        body.define_singleton_method(:each) { |&blk| 128.times { blk.call(chunk) } }
        body.define_singleton_method(:close) { sleep 0.05 }
        [200, { "content-length" => (chunk.bytesize * 128).to_s }, body]
      end
    end
    with_server(app, lint: false, timing_sample_rate: 0.0) do |server, port|
      assert_equal "hi", http(port, "GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n").body
      assert_equal "/hijack", done.pop
      TCPSocket.open("127.0.0.1", port) { |s| s.write("GET /abort HTTP/1.1\r\nHost: x\r\n\r\n") }
      assert_equal "/abort", done.pop
      timing = server.stats[:timing]
      assert_equal 2, timing["run_seconds"][:count]
      assert_operator timing["idle_seconds"][:sum], :>=, 0.19, "0.05 + 0.1 + 0.05 s asleep"
    end
  end
end
