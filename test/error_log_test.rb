# frozen_string_literal: true

require "test_helper"
require "support/http_wire"
require "support/watched_io"
require "serval/server"
require "serval/error_log"

# Error responses the native core answers itself reach the log: one line each
# (status, reason, peer), at most error_log_limit per second, the rest
# counted; the event ring in C stays bounded when nobody reads it.
class ErrorLogTest < Minitest::Test
  include Serval::HttpWire

  LINE = /^serval: error response (\d{3}) ([^\n]*?) peer=(\S+) reason="([^"\n]*)"$/
  SUPPRESSED = /^serval: (\d+) more error responses? not logged in the last [\d.]+s \(error_log_limit (\d+)\/s\)(.*)$/

  # A WatchedIO that waits for a condition on everything written so far.
  class Log < Serval::WatchedIO
    def wait_until(timeout: 5)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      @mutex.synchronize do
        until yield(string)
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise "condition not met within #{timeout}s; log:\n#{string}" if left <= 0

          @cond.wait(@mutex, left)
        end
      end
    end
  end

  def with_logged_server(**opts, &block)
    @err = Log.new
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: @err)
    with_server(->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }, log_writer: log, **opts, &block)
  end

  def error_lines
    @err.string.scan(LINE)
  end

  def test_bad_request_is_logged_with_status_reason_and_peer
    with_logged_server do |_server, port|
      resp = raw_request(port, "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n")
      assert_match %r{\AHTTP/1.1 400 Bad Request\r\n}, resp
      match = @err.wait_for(LINE)
      assert_equal ["400", "Bad Request", "127.0.0.1"], match.captures[0, 3]
      refute_empty match[4]
    end
  end

  def test_each_kind_of_answer_is_logged
    with_logged_server(max_request_line: 64, max_head: 256, read_timeout: 0.2) do |_server, port|
      raw_request(port, "GET /#{'a' * 100} HTTP/1.1\r\n\r\n")
      raw_request(port, "GET / HTTP/1.1\r\nX: #{'b' * 300}\r\n\r\n")
      raw_request(port, "GET / HTTP/2.0\r\nHost: x\r\n\r\n")
      raw_request(port, "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n")
      raw_request(port, "GET / HTTP/1.1\r\nHost: x\r\n") # stalls: 408 after read_timeout
      @err.wait_until { |s| s.scan(LINE).size >= 5 }
      assert_equal %w[414 431 505 501 408], error_lines.map(&:first)
      assert_equal ["Request Timeout", "request timeout"], error_lines.last.values_at(1, 3)
    end
  end

  # Closing an idle keep-alive connection, or one that never sent a byte, is
  # not an error response: nothing was answered, nothing is logged.
  def test_silent_timeouts_are_not_logged
    with_logged_server(persistent_timeout: 0.1, first_data_timeout: 0.1) do |_server, port|
      client = connect(port).write(good_request("/one"))
      assert_equal "HTTP/1.1 200 OK", client.read_response.status_line
      assert_equal :eof, client.wait_close # persistent_timeout
      client.close
      silent = connect(port)
      assert_equal :eof, silent.wait_close # first_data_timeout
      silent.close
      raw_request(port, "BAD\r\n\r\n")
      # the ring is in order: an entry for either close would come first
      @err.wait_for(LINE)
      assert_equal [["400", "Bad Request", "127.0.0.1"]], error_lines.map { |l| l[0, 3] }
    end
  end

  # The flood is sent on 60 connections at once. Whatever the timing, no
  # one-second window holds more than the limit, and every answer is either a
  # line or counted in a suppressed line.
  def test_a_flood_is_rate_limited_with_a_suppressed_count
    n = 60
    limit = 5
    with_logged_server(error_log_limit: limit) do |_server, port|
      clients = Array.new(n) { connect(port) }
      clients.each { |c| c.write("BAD\r\n\r\n") }
      clients.each do |c|
        assert_equal "HTTP/1.1 400 Bad Request", c.read_response.status_line
        c.close
      end
      accounted = lambda do |s|
        s.scan(LINE).size + s.scan(SUPPRESSED).sum { |m| m[0].to_i }
      end
      @err.wait_until { |s| accounted.call(s) >= n }
      assert_equal n, accounted.call(@err.string)
      windows = @err.string.split(SUPPRESSED)
      refute_empty @err.string.scan(SUPPRESSED), "#{n} answers in a burst exceed #{limit} per second"
      windows.each { |w| assert_operator w.scan(LINE).size, :<=, limit, @err.string }
      assert(@err.string.scan(SUPPRESSED).all? { |m| m[1] == limit.to_s })
    end
  end

  def test_limit_zero_logs_nothing
    with_logged_server(error_log_limit: 0) do |server, port|
      raw_request(port, "BAD\r\n\r\n")
      assert_equal 1, server.stats[:rejected]
    end
    assert_empty @err.string.scan(LINE)
  end

  # Nobody reads the ring (no Server, no ErrorLog): it keeps its first
  # `capacity` records and counts the rest as dropped; memory never grows.
  def test_the_ring_is_bounded_and_counts_what_it_drops
    listener = TCPServer.new("127.0.0.1", 0)
    core = Serval::Native::Core.new({})
    core.listen(listener.fileno, "127.0.0.1", listener.local_address.ip_port)
    core.start
    port = listener.local_address.ip_port
    cap = core.error_events_stats[:capacity]
    sent = cap + 50
    sent.times { assert_match(/\AHTTP\/1.1 400 /, raw_request(port, "BAD\r\n\r\n")) }
    # the loop answers in order: once answer k arrived, records before k are in
    stats = core.error_events_stats
    assert_operator stats[:total], :>=, sent - 1
    assert_equal cap, stats[:queued]
    assert_equal stats[:total] - cap, stats[:dropped]

    taken = 0
    dropped = 0
    loop do
      events, lost = core.error_events(0)
      dropped += lost
      break if events.empty?

      taken += events.size
      assert_equal [400, "Bad Request", "bad request line", "127.0.0.1"], events.first
    end
    assert_equal cap, taken
    assert_operator dropped, :>=, sent - 1 - cap
    assert_equal 0, core.error_events_stats[:queued]
  ensure
    core&.shutdown(0)
    listener&.close
  end

  def test_error_events_waits_and_wakes
    core = Serval::Native::Core.new({})
    waiter = Thread.new { core.error_events(30) }
    Thread.pass until waiter.status == "sleep" || !waiter.alive?
    core.wake_error_events
    assert_equal [[], 0], waiter.value
  end

  # ---- configuration --------------------------------------------------------

  def test_error_log_limit_and_max_body_options
    require "tmpdir"
    Dir.mktmpdir do |dir|
      file = File.join(dir, "serval.rb")
      File.write(file, "error_log_limit 3\nhttp_content_length_limit nil\n")
      options = Serval::Configuration.load(config_file: file, warn: ->(_) {})
      assert_equal 3, options[:error_log_limit]
      assert_nil options[:max_body], "nil is Puma's unlimited"
      File.write(file, "error_log_limit(-1)\n")
      error = assert_raises(Serval::ConfigError) { Serval::Configuration.load(config_file: file, warn: ->(_) {}) }
      assert_match(/serval\.rb:1: error_log_limit: must be >= 0/, error.message)
    end
    assert_equal 10, Serval::Configuration::DEFAULTS[:error_log_limit]
  end

  # ---- the limiter alone, on a given clock ----------------------------------

  FakeCore = Struct.new(:woken) do
    def wake_error_events
      self.woken = true
    end
  end

  def event(i)
    [400, "Bad Request", "bad request line", "10.0.0.#{i}"]
  end

  def test_limiter_windows
    err = StringIO.new
    log = Serval::ErrorLog.new(FakeCore.new, Serval::LogWriter.new(stdout: StringIO.new, stderr: err), limit: 3)
    wait = log.handle(Array.new(10) { |i| event(i) }, 0, 100.0)
    assert_in_delta 1.0, wait, 1e-9, "the suppressed count is due when the window ends"
    assert_equal %w[10.0.0.0 10.0.0.1 10.0.0.2], err.string.scan(LINE).map { |l| l[2] }
    assert_in_delta 0.5, log.handle([event(10)], 0, 100.5), 1e-9 # same window: counted
    assert_equal 3, err.string.scan(LINE).size
    assert_empty err.string.scan(SUPPRESSED)
    assert_nil log.handle([], 0, 101.0), "window over: the count is written, nothing is pending"
    assert_equal [["8", "3", ""]], err.string.scan(SUPPRESSED)
    assert_nil log.handle([event(11)], 0, 101.2), "a new window logs again"
    assert_equal 4, err.string.scan(LINE).size
    assert_in_delta 0.5, log.handle([], 2, 101.5), 1e-9, "records the ring dropped are counted too"
    log.flush(101.7)
    assert_equal ["2", "3", " (2 of them not recorded: the error ring was full)"], err.string.scan(SUPPRESSED).last
    assert_equal 2, err.string.scan(SUPPRESSED).size
  end

  def test_limiter_singular_and_nothing_pending
    err = StringIO.new
    log = Serval::ErrorLog.new(FakeCore.new, Serval::LogWriter.new(stdout: StringIO.new, stderr: err), limit: 1)
    log.handle([event(1), event(2)], 0, 5.0)
    log.flush(5.3)
    assert_match(/^serval: 1 more error response not logged in the last 0\.3s \(error_log_limit 1\/s\)$/, err.string)
    log.flush(5.5)
    assert_equal 1, err.string.scan(SUPPRESSED).size, "nothing pending: no second count line"
  end
end

# The same answers, drained the way a served process drains them: single
# mode's loop polls the ring's descriptor on the main thread (Single#supervise,
# ErrorLog#io/#drain), and no error-log thread exists.
class ErrorLogPolledTest < ErrorLogTest
  def with_logged_server(**opts)
    require "serval/launcher"
    require "rack/lint"
    @err = Log.new
    log = Serval::LogWriter.new(stdout: StringIO.new, stderr: @err)
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:0"]).merge(opts))
    app = Rack::Lint.new(->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] })
    launcher = Serval::Launcher.new(options, log_writer: log, app: app, signals: false)
    thread = Thread.new { launcher.run }
    assert launcher.wait_until_booted(10), "booted"
    refute(Thread.list.any? { |t| t.name == "serval-errlog" }, "no error-log thread")
    assert launcher.server.error_log.io, "the loop polls the ring" unless options[:error_log_limit].zero?
    yield launcher.server, Integer(launcher.urls.first[/:(\d+)\z/, 1])
  ensure
    launcher&.stop
    assert_equal 0, thread&.value
  end
end
