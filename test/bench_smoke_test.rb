# frozen_string_literal: true

# Keeps bench/run from rotting: runs `bench/run hello` for one second against
# Serval and Puma and checks that it prints the table and writes plausible
# JSON. The full suite (bench/run all) is not part of the test run.
require "minitest/autorun"
require "json"
require "open3"
require "tmpdir"
require "timeout"

class BenchSmokeTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  LIMIT = 120 # seconds; the run takes ~10 s when bench/Gemfile is installed

  def wrk?
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).any? { |d| File.executable?(File.join(d, "wrk")) }
  end

  def run_bench(json)
    env = { "BENCH_DURATION" => "1", "BENCH_WARMUP" => "0", "BENCH_ROUNDS" => "1", "BENCH_CONNECTIONS" => "4",
            "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil }
    argv = [RbConfig.ruby, File.join(ROOT, "bench", "run"), "--servers=serval,puma", "--no-docs", "--out=#{json}", "hello"]
    Open3.popen2e(env, *argv, chdir: ROOT, pgroup: true) do |stdin, out, wait|
      stdin.close
      reader = Thread.new { out.read }
      unless wait.join(LIMIT)
        Process.kill(:TERM, -wait.pid)
        wait.join(10) || Process.kill(:KILL, -wait.pid)
        flunk "bench/run hello did not finish within #{LIMIT}s:\n#{reader.value}"
      end
      [wait.value, reader.value]
    end
  end

  def test_bench_run_hello_prints_a_table_and_writes_json
    skip "wrk is not installed (apt-get install -y wrk); bench/run needs it" unless wrk?

    Dir.mktmpdir("bench-smoke") do |dir|
      json = File.join(dir, "hello.json")
      status, output = run_bench(json)
      assert status.success?, "bench/run hello failed (#{status.inspect}):\n#{output}"

      assert_match(/^### hello: /, output)
      %w[serval puma].each { |s| assert_match(/^\| #{s}\s+\|/, output, "no #{s} row in:\n#{output}") }
      assert_match(/^\| server\s+\| version\s+\| processes x threads\s+\| req\/s\s+\| vs serval/, output)

      report = JSON.parse(File.read(json))
      assert_equal %w[puma serval], report["versions"].keys.grep(/serval|puma/).sort
      hello = report["workloads"].find { |w| w["name"] == "hello" }
      refute_nil hello, "no hello workload in #{json}"
      %w[serval puma].each do |name|
        s = hello["servers"][name]
        refute_nil s, "no #{name} figures"
        assert_operator s["rps"], :>, 100, "#{name}: implausible req/s #{s['rps']}"
        assert_operator s["rps"], :<, 10_000_000
        assert_operator s["p50_ms"], :>, 0
        assert_operator s["p99_ms"], :>=, s["p50_ms"]
        assert_equal 0, s["errors"], "#{name}: errors in #{s['rounds'].inspect}"
        assert_match(/wrk -t1 -c4 -d1s/, s["wrk_command"])
      end
      assert_in_delta hello["ratio"], hello["servers"]["serval"]["rps"] / hello["servers"]["puma"]["rps"], 0.01
    end
  end
end
