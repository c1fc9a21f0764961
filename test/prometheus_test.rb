# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "tmpdir"
require "serval/prometheus"
require "serval/launcher"
require "support/watched_io"

# Prometheus text format 0.0.4: names, types, worker labels, timing entries,
# and promtool's verdict on real output.
class PrometheusTest < Minitest::Test
  NOW = Time.utc(2026, 1, 1, 0, 0, 10)
  SINGLE = { started_at: "2026-01-01T00:00:00Z", backlog: 1, running: 4, pool_capacity: 2, busy_threads: 3,
             max_threads: 5, requests_count: 42 }.freeze
  # entries shaped and named as Timing::Recorder#stats makes them
  TIMING = {
    run_seconds: { type: :histogram, help: "Time a request held the GVL",
                   buckets: [[0.005, 3], [0.1, 7], [Float::INFINITY, 9]], sum: 1.25, count: 9 },
    gvl_utilization: { type: :gauge, help: "Share of wall time some thread held the GVL", value: 0.125 },
    request_run_seconds_total: { type: :counter, help: "Seconds requests held the GVL, summed", value: 17 },
    gvl_waiting_threads: { type: :gauge, help: "Threads waiting for the GVL now (NaN on Ruby < 3.2)", value: nil }
  }.freeze

  def test_the_fixture_names_are_ones_the_recorder_makes
    require "serval/timing"
    made = Serval::Timing::Recorder.new(sample_rate: 0.05).stats.keys.map(&:to_s)
    assert_empty TIMING.keys.map(&:to_s) - made
  end

  def cluster
    worker = lambda do |index, pid, requests, timing = nil|
      status = SINGLE.merge(requests_count: requests)
      status[:timing] = timing if timing
      { started_at: "2026-01-01T00:00:01Z", pid: pid, index: index, phase: 0, booted: true,
        last_checkin: "2026-01-01T00:00:08Z", last_status: status }
    end
    { started_at: "2026-01-01T00:00:00Z", workers: 2, phase: 0, booted_workers: 2, old_workers: 0,
      worker_status: [worker.call(0, 101, 5, TIMING), worker.call(1, 102, 6)] }
  end

  def render(stats)
    Serval::Prometheus.render(stats, process: {}, now: NOW)
  end

  def test_single_mode_names_types_and_values
    text = render(SINGLE)
    assert_includes text, "# HELP serval_backlog Complete requests waiting for a thread\n# TYPE serval_backlog gauge\nserval_backlog 1\n"
    assert_includes text, "# TYPE serval_requests_total counter\nserval_requests_total 42\n"
    assert_includes text, "serval_busy_threads 3\n"
    assert_includes text, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1767225600\n"
    refute_match(/started_at/, text)
    assert text.end_with?("\n")
  end

  def test_unknown_numeric_stats_become_gauges
    text = render(SINGLE.merge(new_thing: 2.5, "odd-key": 1, label: "text"))
    assert_includes text, "# TYPE serval_new_thing gauge\nserval_new_thing 2.5\n"
    assert_includes text, "serval_odd_key 1\n"
    refute_match(/label/, text)
  end

  def test_cluster_mode_labels_each_worker
    text = render(cluster)
    assert_includes text, "serval_workers 2\n"
    assert_includes text, "serval_booted_workers 2\n"
    assert_includes text, %(serval_requests_total{worker="0",pid="101"} 5\n)
    assert_includes text, %(serval_requests_total{worker="1",pid="102"} 6\n)
    assert_includes text, %(serval_worker_booted{worker="1",pid="102"} 1\n)
    assert_includes text, %(serval_worker_last_checkin_age_seconds{worker="0",pid="101"} 2\n)
    assert_equal 1, text.scan("# TYPE serval_requests_total counter").size, "one family, samples together"
  end

  def test_timing_entries
    text = render(cluster)
    labels = 'worker="0",pid="101"'
    assert_includes text, "# HELP serval_run_seconds Time a request held the GVL\n# TYPE serval_run_seconds histogram\n"
    assert_includes text, %(serval_run_seconds_bucket{#{labels},le="0.005"} 3\n)
    assert_includes text, %(serval_run_seconds_bucket{#{labels},le="+Inf"} 9\n)
    assert_includes text, %(serval_run_seconds_sum{#{labels}} 1.25\nserval_run_seconds_count{#{labels}} 9\n)
    assert_includes text, %(# TYPE serval_gvl_utilization gauge\nserval_gvl_utilization{#{labels}} 0.125\n)
    assert_includes text, %(# TYPE serval_request_run_seconds_total counter\nserval_request_run_seconds_total{#{labels}} 17\n)
    refute_match(/serval_gvl_waiting_threads\{/, text, "a nil value is left out")
  end

  def test_histogram_from_a_json_checkin
    # a worker's status crosses a pipe as JSON: +Inf arrives as nil, types as strings
    hist = { type: "histogram", help: "h", buckets: [[0.5, 1], [nil, 2]], sum: 0.75, count: 2 }
    text = render(SINGLE.merge(timing: { queue_seconds: hist }))
    assert_includes text, %(serval_queue_seconds_bucket{le="0.5"} 1\nserval_queue_seconds_bucket{le="+Inf"} 2\n)
  end

  POOLS = [{ name: "primary", size: 5, connections: 3, busy: 2, idle: 1, waiting: 0, dead: 0 },
           { name: "animals", size: 2, connections: 0, busy: 0, idle: 0, waiting: 1, dead: 0 }].freeze

  def test_db_pools_are_labelled_by_pool_and_worker
    text = render(SINGLE.merge(db_pools: POOLS))
    assert_includes text, "# TYPE serval_db_pool_size gauge\nserval_db_pool_size{pool=\"primary\"} 5\n" \
                          "serval_db_pool_size{pool=\"animals\"} 2\n"
    %w[connections busy idle waiting dead].each { |f| assert_match(/^serval_db_pool_#{f}\{pool="primary"\} \d+$/, text) }
    stats = cluster
    stats[:worker_status][1][:last_status] = stats[:worker_status][1][:last_status].merge(db_pools: POOLS)
    text = render(stats)
    assert_includes text, %(serval_db_pool_waiting{worker="1",pid="102",pool="animals"} 1\n)
    check_with_promtool(text)
  end

  def test_escaping
    assert_equal 'a\\\\b\\"c\\nd', Serval::Prometheus.escape_label("a\\b\"c\nd")
    assert_equal "x\\\\y\\nz", Serval::Prometheus.escape_help("x\\y\nz")
    assert_equal "+Inf", Serval::Prometheus.number(Float::INFINITY)
    assert_equal "NaN", Serval::Prometheus.number(Float::NAN)
  end

  def test_process_figures
    text = Serval::Prometheus.render(SINGLE)
    assert_match(/^process_cpu_seconds_total \d/, text)
    assert_match(/^process_resident_memory_bytes \d+$/, text) if File.exist?("/proc/self/statm")
    assert_match(/^ruby_gc_runs_total \d+$/, text)
  end

  def promtool
    path = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "promtool") }
    path.find { |f| File.executable?(f) } or skip("promtool not installed (Debian: apt-get install prometheus); CI installs it")
  end

  def check_with_promtool(text)
    out, status = Open3.capture2e(promtool, "check", "metrics", stdin_data: text)
    assert status.success?, "promtool check metrics failed:\n#{out}\n--- input:\n#{text}"
    assert_empty out.strip, "promtool lint findings:\n#{out}"
  end

  def test_promtool_accepts_rendered_cluster_and_timing
    check_with_promtool(Serval::Prometheus.render(cluster))
  end

  def test_promtool_accepts_the_live_metrics_listener
    tool = promtool
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
      binds: ["tcp://127.0.0.1:0"], metrics_bind: "tcp://127.0.0.1:0"
    ))
    out = Serval::WatchedIO.new
    app = ->(_env) { [200, { "content-type" => "text/plain" }, ["hi"]] }
    launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: out, stderr: StringIO.new),
                                             app: app, signals: false)
    thread = Thread.new { launcher.run }
    begin
      port = out.wait_for(%r{\* Metrics on http://127\.0\.0\.1:(\d+)/metrics})[1].to_i
      app_port = launcher.urls.first[/:(\d+)\z/, 1].to_i
      raw_request(app_port, "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
      response = raw_request(port, "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
      head, body = response.split("\r\n\r\n", 2)
      assert_match(%r{\AHTTP/1\.1 200 }, head)
      assert_match(%r{content-type: text/plain; version=0\.0\.4}i, head)
      assert_match(/^serval_requests_total 1$/, body)
      # single mode: the same families as a cluster worker, without labels
      assert_match(/^serval_connections \d+$/, body)
      assert_match(/^serval_requests_rejected_total 0$/, body)
      assert_includes body, "# TYPE serval_queue_seconds histogram\n"
      assert_match(/^serval_queue_seconds_bucket\{le="\+Inf"\} 1$/, body)
      assert_match(/^serval_queue_seconds_count 1$/, body)
      assert_match(/^serval_gvl_utilization \S+$/, body)
      out_text, status = Open3.capture2e(tool, "check", "metrics", stdin_data: body)
      assert status.success?, "promtool: #{out_text}\n#{body}"
      assert_empty out_text.strip
      assert_match(%r{\AHTTP/1\.1 404 }, raw_request(port, "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"))
    ensure
      launcher.stop
      assert_equal 0, thread.join(10)&.value
    end
  end
end
