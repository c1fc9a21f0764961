# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "rbconfig"

# ext/serval/hooks.h: the serving core calls timing (and load shedding)
# through a table of hooks, empty until they attach. The hooks are
# process-wide, so a fresh process shows the core with nothing attached.
class HooksTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  LIMIT = 15 # seconds for the child

  CHILD = <<~'RUBY'
    require "test_helper"
    require "serval/timing"
    include Serval::TestHelpers
    get = ->(port) { raw_request(port, "GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")[/\AHTTP\/1.1 (\d+)/, 1] }
    seen = Queue.new
    app = ->(env) { seen << env.key?("serval.timing"); [200, { "content-type" => "text/plain" }, ["hi"]] }
    puts "loaded attached=#{Serval::Timing.attached?}"
    with_server(app, timing: false) do |server, port|
      puts "off status=#{get.(port)} timing_key=#{seen.pop} attached=#{Serval::Timing.attached?} " \
           "stats_timing=#{server.stats[:timing].inspect} estimate=#{server.stats.key?(:queue_wait_estimate)}"
    end
    with_server(app, timing: true, timing_sample_rate: 1.0, max_queue_time: 0.5) do |server, port|
      puts "on status=#{get.(port)} timing_key=#{seen.pop} attached=#{Serval::Timing.attached?} " \
           "count=#{server.stats[:timing]['queue_seconds'][:count]} estimate=#{server.stats.key?(:queue_wait_estimate)}"
    end
  RUBY

  def test_the_core_serves_with_nothing_attached_and_timing_attaches
    out, status = run_child
    assert status.success?, out
    lines = out.lines.map(&:chomp).grep(/\A(loaded|off|on) /)
    assert_equal ["loaded attached=false",
                  "off status=200 timing_key=false attached=false stats_timing=nil estimate=false",
                  "on status=200 timing_key=true attached=true count=1 estimate=true"], lines, out
  end

  private

  def run_child
    argv = [RbConfig.ruby, "-w", "-I#{ROOT}/lib", "-I#{ROOT}/test", "-e", CHILD]
    Open3.popen2e({ "RUBYOPT" => nil }, *argv, chdir: ROOT, pgroup: true) do |stdin, out, wait|
      stdin.close
      reader = Thread.new { out.read }
      unless wait.join(LIMIT)
        Process.kill(:KILL, -wait.pid)
        wait.join
        flunk "the child did not finish within #{LIMIT}s:\n#{reader.value}"
      end
      [reader.value, wait.value]
    end
  end
end
