# frozen_string_literal: true

require "test_helper"
require "support/http_wire"

# Thread polls (ext/serval/request.c, docs/DESIGN.md "Thread polls"): request
# threads read new requests between requests while the event loop parks, and
# a queued request wakes a sleeping thread only when the running one blocks
# or computes for long. These tests check when it is on, that requests under
# concurrent keep-alive load come back whole and to the right client, and
# that a blocked or computing request never holds up queued ones.
class ThreadPollsTest < Minitest::Test
  include Serval::HttpWire

  # The thread event hook it needs (Ruby 3.3 here, as the GVL split).
  HOOK = Serval::Native::GVL.respond_to?(:supported?) ? Serval::Native::GVL.supported? : RUBY_VERSION >= "3.3"

  ECHO = lambda do |env|
    [200, { "content-type" => "text/plain" }, [env["PATH_INFO"]]]
  end

  def get(path)
    "GET #{path} HTTP/1.1\r\nHost: example.test\r\n\r\n"
  end

  def test_on_by_default_where_ruby_has_the_thread_event_hook
    with_server(ECHO) do |server, port|
      assert_equal 200, connect(port).write(get("/")).read_response.status
      assert_equal HOOK, server.core.stats[:thread_polls]
    end
  end

  def test_off_when_configured_off
    with_server(ECHO, thread_polls: false) do |server, port|
      assert_equal 200, connect(port).write(get("/")).read_response.status
      refute server.core.stats[:thread_polls]
    end
  end

  def test_on_with_threads_auto_and_the_io_lane
    [{ threads_auto: true, min_threads: 1, max_threads: 4, threads_auto_max: 4 }, { max_io_threads: 2 }].each do |opts|
      with_server(ECHO, **opts) do |server, port|
        assert_equal 200, connect(port).write(get("/")).read_response.status
        assert_equal HOOK, server.core.stats[:thread_polls], opts.inspect
      end
    end
  end

  # Load shedding counts the thread that polls as one that takes the next
  # request (loop.c takers_locked); cluster balancing and TLS are tested in
  # gvl_balance_test.rb and tls_test.rb.
  def test_on_with_load_shedding
    with_server(ECHO, max_queue_time: 1.0) do |server, port|
      assert_equal 200, connect(port).write(get("/")).read_response.status
      assert_equal HOOK, server.core.stats[:thread_polls]
    end
  end

  # 8 clients x 150 keep-alive requests, each path unique: every answer is
  # its own request's, and request threads ran rounds of the loop.
  def test_concurrent_keep_alive_requests_come_back_whole_and_in_order
    with_server(ECHO, min_threads: 4, max_threads: 4) do |server, port|
      errors = Queue.new
      clients = Array.new(8) do |c|
        Thread.new do
          client = connect(port)
          150.times do |i|
            path = "/c#{c}/r#{i}"
            client.write(get(path))
            r = client.read_response
            errors << "#{path}: #{r.status} #{r.body.inspect}" unless r.status == 200 && r.body == path
          end
          client.close
        rescue StandardError => e
          errors << "client #{c}: #{e.class}: #{e.message}"
        end
      end
      clients.each(&:join)
      assert_empty Array.new(errors.size) { errors.pop }
      skip "no thread event hook: the loop reads every request" unless HOOK
      assert_operator server.core.stats[:polled_rounds], :>, 0
    end
  end

  # Four clients, each one request at a time: whenever the threads have
  # answered everything sent so far they have nothing to do, and one of them
  # waits on the epoll itself (request.c sv_polls_wait) instead of handing it
  # back to the loop thread, so the next request is read by the thread that
  # runs it. Every answer is the right one, and such waits happened.
  def test_a_thread_with_nothing_to_do_waits_on_the_epoll_for_the_next_request
    skip "no thread event hook: the loop reads every request" unless HOOK
    with_server(ECHO, min_threads: 4, max_threads: 4) do |server, port|
      answers = Queue.new
      clients = Array.new(4) do |c|
        Thread.new do
          client = connect(port)
          300.times do |i|
            r = client.write(get("/c#{c}/#{i}")).read_response
            answers << (r.status == 200 && r.body == "/c#{c}/#{i}" ? :ok : "#{c}/#{i}: #{r.status} #{r.body}")
          end
          client.close
        end
      end
      clients.each(&:join)
      assert_equal [:ok], Array.new(answers.size) { answers.pop }.uniq
      stats = server.core.stats
      assert_operator stats[:polled_waits], :>, 0
      assert_operator stats[:polled_rounds], :>=, stats[:polled_waits]
    end
  end

  # While request threads poll the loop thread stays parked, but its timeout
  # scan still runs (loop.c park returns for it): a head that stops halfway
  # gets its 408 after read_timeout while eight clients keep the threads
  # busy. (Here the duty also ends whenever the threads run dry; the scan
  # must not depend on that.)
  def test_timeouts_are_enforced_while_threads_poll
    with_server(ECHO, read_timeout: 0.3, min_threads: 4, max_threads: 4) do |server, port|
      stop = [false]
      load = Array.new(8) do |c|
        Thread.new do
          client = connect(port)
          n = 0
          until stop[0]
            r = client.write(get("/c#{c}/#{n}")).read_response
            raise "wrong answer #{r.body.inspect}" unless r.body == "/c#{c}/#{n}"

            n += 1
            next unless r.field("connection") == "close" # max_keepalive_requests

            client.close
            client = connect(port)
          end
          client.close
          n
        end
      end
      Thread.pass until server.core.stats[:requests] > 200 || load.none?(&:alive?)
      partial = connect(port).write("GET /partial HTTP/1.1\r\nHost: ex")
      response = partial.read_response(timeout: 10)
      busy = load.all?(&:alive?)
      stop[0] = true
      assert_operator load.sum(&:value), :>, 200
      assert_equal 408, response.status
      assert busy, "the 408 came only after the load stopped"
    end
  end

  # Two threads. /slow runs `hold` (told when it started) until `let_go` is
  # called; meanwhile five requests on new connections must be answered by
  # the other thread.
  def assert_served_beside(hold, let_go)
    started = Queue.new
    app = lambda do |env|
      if env["PATH_INFO"] == "/slow"
        started << true
        hold.call
      end
      ECHO.call(env)
    end
    with_server(app, min_threads: 2, max_threads: 2) do |_server, port|
      slow = connect(port).write(get("/slow"))
      started.pop
      5.times do |i|
        assert_equal "/fast#{i}", connect(port).write(get("/fast#{i}")).read_response(timeout: 20).body
      end
      let_go.call
      assert_equal "/slow", slow.read_response(timeout: 20).body
    end
  end

  # /slow waits inside the app (Queue#pop gives the GVL away).
  def test_a_blocked_request_does_not_hold_up_queued_ones
    release = Queue.new
    assert_served_beside(-> { release.pop }, -> { release << true })
  end

  # /slow computes (holds the GVL, never blocks): the fairness slice hands
  # the GVL over, and the queued requests get the other thread.
  def test_a_computing_request_does_not_starve_queued_ones
    done = [false]
    spin = lambda do
      x = 0
      x += 1 until done[0]
    end
    assert_served_beside(spin, -> { done[0] = true })
  end
end
