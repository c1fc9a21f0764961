# frozen_string_literal: true

# bench/lib/bench/open_loop.rb, the open-loop generator the advice, auto and
# shed workloads measure p99 with: against a plain TCP responder (no Serval,
# no timing), every scheduled request is answered and, with latencies: true,
# each counted latency is returned, so runs can be pooled; Util.percentile
# reads a pooled list the way the generator reads its own.
require_relative "test_helper"
require "socket"
require "json"
require_relative "../bench/lib/bench"
require_relative "../bench/lib/bench/open_loop"

class BenchOpenLoopTest < Minitest::Test
  def setup
    @server = TCPServer.new("127.0.0.1", 0)
    @threads = []
    @paths = Queue.new
    @acceptor = Thread.new do
      loop do
        sock = @server.accept
        @threads << Thread.new(sock) { |s| answer(s) }
      end
    rescue IOError
      nil
    end
  end

  def teardown
    @server.close
    @acceptor.join(5)
    @threads.each { |t| t.kill.join(5) }
  end

  def answer(sock)
    while (line = sock.gets("\r\n"))
      @paths << line.split[1] if line.start_with?("GET ")
      next unless line == "\r\n"

      @serial&.synchronize { sleep @serial_seconds } # one request at a time: a server of 1 / serial_seconds req/s
      sock.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    end
  rescue IOError, SystemCallError
    nil
  ensure
    sock.close
  end

  def run_open_loop(**opts)
    Bench::OpenLoop.new(host: "127.0.0.1", port: @server.addr[1], path: "/", rate: 200, duration: 0.5, warmup: 0.1,
                        connections: 4, seed: 3, **opts).run
  end

  def test_latencies_are_every_counted_answer_and_pool_like_the_generators_own
    r = run_open_loop(latencies: true)
    assert_equal 0, r[:errors]
    assert_equal r[:counted], r[:completed]
    assert_equal r[:completed], r[:latencies_ms].size
    assert_equal r[:latencies_ms].sort, r[:latencies_ms]
    assert_in_delta r[:p99_ms], Bench::Util.percentile(r[:latencies_ms], 0.99), 0.01
    assert_in_delta r[:p50_ms], Bench::Util.percentile(r[:latencies_ms], 0.5), 0.01
    refute run_open_loop.key?(:latencies_ms), "latencies only when asked"
  end

  # --tag: request i of the schedule asks for r = seed x 10^7 + i, each once,
  # so an app can draw the same work for it on every server.
  def test_tag_numbers_every_scheduled_request_once
    r = Bench::OpenLoop.new(host: "127.0.0.1", port: @server.addr[1], path: "/work?ms=20", rate: 200, duration: 0.5,
                            warmup: 0.1, connections: 4, seed: 3, tag: true).run
    paths = Array.new(@paths.size) { @paths.pop }
    assert_equal r[:sent], paths.size
    tags = paths.map { |p| p[%r{\A/work\?ms=20&r=(\d+)\z}, 1] }
    assert tags.all?, paths.first(3).inspect
    assert_equal (0...paths.size).map { |i| (3 * Bench::OpenLoop::TAG_BASE) + i }, tags.map(&:to_i).sort
    run_open_loop
    assert(Array.new(@paths.size) { @paths.pop }.all? { |p| p == "/" }, "no tag unless asked")
  end

  # --mix: each request goes to one of the paths, drawn by weight from the
  # seed (the same seed, the same paths in order), tagged after its own query.
  def test_mix_draws_paths_by_weight_the_same_for_a_seed
    mix = "/a@60,/b?ms=80@10,/c@30"
    r = Bench::OpenLoop.new(host: "127.0.0.1", port: @server.addr[1], path: "/", rate: 400, duration: 0.5, warmup: 0.1,
                            connections: 4, seed: 5, tag: true, mix: mix).run
    paths = Array.new(@paths.size) { @paths.pop }
    assert_equal r[:sent], paths.size
    assert(paths.all? { |p| p.match?(%r{\A/(a\?|c\?|b\?ms=80&)r=\d+\z}) }, paths.first(5).inspect)
    drawn = Bench::OpenLoop.draw_paths(mix, r[:sent], Random.new(5 + 7919))
    by_tag = paths.to_h { |p| [p[/r=(\d+)/, 1].to_i - (5 * Bench::OpenLoop::TAG_BASE), p.split(/[?&]r=/).first] }
    assert_equal drawn, (0...r[:sent]).map { |i| by_tag.fetch(i) }
    big = Bench::OpenLoop.draw_paths(mix, 20_000, Random.new(1)).tally
    assert_in_delta 0.6, big["/a"] / 20_000.0, 0.02
    assert_in_delta 0.1, big["/b?ms=80"] / 20_000.0, 0.01
    assert_raises(ArgumentError) { Bench::OpenLoop.draw_paths("a@1", 1, Random.new(1)) }
    assert_raises(ArgumentError) { Bench::OpenLoop.draw_paths("/a@0", 1, Random.new(1)) }
  end

  # bench/run advice leaves a run out of its pooled p99 when the generator
  # fell behind its schedule (more than 1 % of its requests sent late).
  def test_a_run_behind_its_schedule_is_told_apart
    advice = Bench::Workloads::Advice
    assert advice.on_schedule?({ "sent" => 12_000, "late" => 0 })
    assert advice.on_schedule?({ "sent" => 12_000, "late" => 120 })
    refute advice.on_schedule?({ "sent" => 12_000, "late" => 240 })
    refute advice.on_schedule?({ "sent" => 0, "late" => 2 })
  end

  # bench/run advice compares auto with fixed counts only at a rate the best
  # fixed count keeps up with: a server of ~50 req/s keeps up with 15 a
  # second and not with 120 (answered behind the schedule: goodput under
  # 95 % of the scheduled rate), and the goodput it reaches behind is its
  # open-loop capacity, from which the rate is taken again.
  def test_a_rate_the_server_does_not_sustain_is_told_apart
    @serial = Mutex.new
    @serial_seconds = 0.02
    slow = lambda do |rate|
      r = Bench::OpenLoop.new(host: "127.0.0.1", port: @server.addr[1], path: "/", rate: rate, duration: 1.0, warmup: 0,
                              connections: 8, seed: 3).run
      JSON.parse(JSON.generate(r))
    end
    behind = slow.call(120)
    refute Bench::Workloads::Advice.sustained?([behind]), behind.inspect
    assert_operator behind["goodput_rps"], :<, 55
    assert_operator behind["goodput_rps"], :>, 20
    kept = slow.call(15)
    assert Bench::Workloads::Advice.sustained?([kept]), kept.inspect
    refute Bench::Workloads::Advice.sustained?([kept, behind])
  end

  # Session 27's three runs at 35 % CPU (advice-quick-auto35-s27.json):
  # auto 193 / 348 / 144 ms, fixed 5 threads 191 / 282 / 136, fixed 6
  # 177 / 268 / 147. Pooled, the second seed sets both p99s; paired, each
  # seed is judged on its own, against the best count on that seed.
  def test_auto_is_paired_with_the_best_fixed_count_on_each_seed
    r = Bench::Workloads::Advice.paired_ratios([193.483, 348.13, 144.079], [[191.27, 282.426, 135.622], [177.182, 268.039, 147.438]])
    assert_equal [1.09, 1.3, 1.06], r.map { |x| x.round(2) }
    assert_equal [nil, 2.0], Bench::Workloads::Advice.paired_ratios([nil, 20.0], [[5.0, 10.0], [6.0, 12.0]])
    assert_equal [1.0, nil], Bench::Workloads::Advice.paired_ratios([5.0, 20.0], [[5.0, 10.0], [6.0]]), "a seed a fixed count lacks"
  end

  def test_the_servers_compared_take_turns_first_and_last
    orders = Bench::Workloads::Advice.rotations(3, 3)
    assert_equal [[0, 1, 2], [1, 2, 0], [2, 0, 1]], orders
    3.times { |k| assert_equal [0, 1, 2], orders.map { |o| o.index(k) }.sort, "server #{k} once in each place" }
    assert_equal [[0, 1], [1, 0], [0, 1]], Bench::Workloads::Advice.rotations(2, 3)
  end

  def test_the_plateau_is_the_median_of_the_rows_from_the_knee_up
    rows = [400, 755, 779, 546, 614].each_with_index.map { |r, i| { "threads" => 9 + i, "rps" => r.to_f } }
    assert_equal 684.5, Bench::Workloads::Advice.plateau_median(rows, 10)
    assert_equal 580.0, Bench::Workloads::Advice.plateau_median(rows, 12)
    assert_nil Bench::Workloads::Advice.plateau_median(rows, 20)
  end

  def test_percentile_of_nothing_is_nil_and_nearest_rank
    assert_nil Bench::Util.percentile([], 0.99)
    assert_equal 99, Bench::Util.percentile((1..100).to_a, 0.99)
    assert_equal 100, Bench::Util.percentile((1..101).to_a, 0.99)
  end
end
