# frozen_string_literal: true

require_relative "test_helper"
require "support/subprocess_server"
require "support/http_wire"
require "serval/configuration"
require "serval/cluster"

# worker_max_requests, worker_max_memory and Serval.replace_worker: the
# master replaces one worker at a time, with the reason in the log, and no
# request fails meanwhile.
class WorkerRecyclingTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  Recycler = Serval::Cluster::Recycler

  def recycler(max_requests: nil, max_memory: nil, jitter: 0.0, memory: ->(_pid) { nil })
    Recycler.new(max_requests: max_requests, jitter: jitter, max_memory: max_memory, interval: 5.0,
                 rng: Random.new(7), memory: memory)
  end

  def test_request_limit_with_jitter_is_drawn_once_per_worker
    r = recycler(max_requests: 1000, jitter: 0.1)
    limits = (1..50).map { |pid| r.limit(pid) }
    assert(limits.all? { |l| l.between?(1000, 1100) }, limits.inspect)
    assert_operator limits.uniq.size, :>, 1, "jitter draws different limits"
    assert_equal limits.first, r.limit(1), "a worker keeps its limit"
    assert_nil r.reason(1, { requests_count: limits.first - 1 }, 0.0)
    assert_equal :requests, r.reason(1, { requests_count: limits.first }, 0.0).first
  end

  def test_memory_limit_reads_at_most_once_per_interval
    reads = 0
    r = recycler(max_memory: 100, memory: lambda { |_pid|
      reads += 1
      [reads == 1 ? 50.0 : 150.0, "PSS"]
    })
    assert_nil r.reason(9, {}, 0.0)
    assert_nil r.reason(9, {}, 1.0), "no new reading within the interval"
    kind, why = r.reason(9, {}, 6.0)
    assert_equal :memory, kind
    assert_equal "PSS 150 MB >= 100 MB", why
    assert_equal 2, reads
  end

  def test_asked_reason_comes_first
    r = recycler(max_requests: 1)
    assert_equal [:asked, "asked: stuck request"], r.reason(3, { recycle: "stuck request", requests_count: 5 }, 0.0)
  end

  def test_reads_this_process_memory
    mb, kind = Recycler.memory_mb(Process.pid)
    assert_includes %w[PSS RSS], kind
    assert_operator mb, :>, 1.0
    assert_nil Recycler.memory_mb(2**22 + 12_345), "no such process"
  end

  def test_bad_values_are_refused_at_boot
    [["worker_max_requests 0", /worker_max_requests/], ["worker_max_memory(-5)", /worker_max_memory/],
     ["worker_max_requests_jitter 2", /worker_max_requests_jitter/]].each do |line, pattern|
      assert_match pattern, assert_raises(Serval::ConfigError) { config_from("#{line}\n") }.message
    end
  end

  APP = %(run ->(env) { [200, {"content-type" => "text/plain"}, ["ok \#{Process.pid}"]] }\n)

  def cluster(extra, app: APP, workers: 2)
    config = "bind 'tcp://127.0.0.1:0'\nthreads 2, 2\nworkers #{workers}\nworker_check_interval 0.2\n#{extra}\n"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => app, "c.rb" => config }).boot
    server.wait_for(/Worker #{workers - 1} \(PID: \d+\) booted/)
    server
  end

  def test_max_requests_replaces_workers_without_failures
    server = cluster("worker_max_requests 150\nworker_max_requests_jitter 0")
    load = Serval::HttpWire::LoadClient.new(server.port, threads: 4).start
    server.wait_for(/Worker \d \(PID: \d+\) recycled: \d+ requests >= 150/, timeout: 20)
    server.wait_for_count(/Worker \d \(PID: \d+\) booted/, 3, timeout: 20)
    assert load.wait_for_more(100), "serving after the replacement"
    result = load.stop
    assert_equal 0, result.failed, "failures: #{result.errors.inspect}\n#{server.logs}"
  ensure
    load&.stop
  end

  GROW = <<~RUBY
    HOARD = []
    run lambda { |env|
      HOARD << ("x" * (4 << 20)).tap { |s| s.setbyte(0, 1) } if env["PATH_INFO"] == "/grow"
      [200, {"content-type" => "text/plain"}, ["\#{Process.pid} \#{HOARD.size}"]]
    }
  RUBY

  def test_max_memory_replaces_a_growing_worker
    server = cluster("worker_max_memory 150", app: GROW, workers: 1)
    first = get_pid(server.port, "/")
    40.times { get_pid(server.port, "/grow") } # 160 MB kept by the one worker
    server.wait_for(/Worker 0 \(PID: #{first}\) recycled: (PSS|RSS) \d+ MB >= 150 MB/, timeout: 20)
    server.wait_for_count(/Worker 0 \(PID: \d+\) booted/, 2, timeout: 20)
    server.wait_for(/Worker 0 \(PID: #{first}\) stopped/, timeout: 20)
    logs = server.stdout
    assert_operator logs.index(/Worker 0 \(PID: (?!#{first}\))\d+\) booted/), :<, logs.index(/Worker 0 \(PID: #{first}\) stopped/),
                    "the replacement boots before the old worker stops"
    refute_equal first, get_pid(server.port, "/"), "a new worker serves"
  end

  ASK = <<~RUBY
    run lambda { |env|
      asked = env["PATH_INFO"] == "/leave" && Serval.replace_worker("the app asked")
      [200, {"content-type" => "text/plain"}, ["\#{Process.pid} \#{asked}"]]
    }
  RUBY

  def test_app_asks_for_its_worker_to_be_replaced
    server = cluster("", app: ASK, workers: 1)
    response = get_response(server.port, "/leave")
    pid, asked = response.body.split
    assert_equal "true", asked
    server.wait_for(/Worker 0 \(PID: #{pid}\) recycled: asked: the app asked/, timeout: 20)
    server.wait_for(/Worker 0 \(PID: #{pid}\) stopped/, timeout: 20)
    refute_equal pid, get_pid(server.port, "/")
  end

  def test_replace_worker_outside_a_cluster_does_nothing
    require "serval/replace_worker"
    refute Serval.replace_worker("single mode")
  end

  private

  def get_response(port, path)
    response = http(port, "GET #{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_equal "200", response.status_line.split[1], response.raw
    response
  end

  def get_pid(port, path)
    get_response(port, path).body.split.first
  end
end
