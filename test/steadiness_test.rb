# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "rbconfig"
require "serval/timing"
require "support/cpu_rivals"

# ext/serval/steadiness.c: the CPU's speed as the GVL's holder sees it (CPU
# time / GVL time held, per 0.25 s step). A thread that spins alone on its
# CPU runs at about full speed; with another busy process pinned to the same
# CPU it gets about half. The margins are wide (0.5 against a 0.75 limit,
# ~1.0 against 0.85): this checks that sharing registers, not how fast
# the machine is.
class SteadinessTest < Minitest::Test
  CHILD = <<~RUBY
    require "serval"
    require "json"
    G = Serval::Native::GVL
    G.enable
    Thread.new { x = 0; loop { x += 1 } }
    wait = ->(n) { sleep 0.05 until G.steadiness[1].size >= n }
    wait.call(8)
    alone = G.steadiness[1].last(6)
    $stdout.puts "alone"; $stdout.flush
    $stdin.gets
    start = G.steadiness[1].size
    wait.call(start + 7)
    shared = G.steadiness[1].last(6)
    $stdout.puts JSON.generate([alone, shared]); $stdout.flush
  RUBY

  def setup
    skip "Ruby #{RUBY_VERSION} has no GVL event hook (needs 3.2+)" unless Serval::Native::GVL.supported?
    skip "needs taskset (util-linux)" unless system("taskset", "-c", "0", "true", out: File::NULL, err: File::NULL)
  end

  def median_speed(steps)
    speeds = steps.map { |_at, held, cpu| cpu / held }.sort
    speeds[speeds.size / 2]
  end

  def test_sharing_the_cpu_slows_the_gvl_holder
    lib = File.expand_path("../lib", __dir__)
    cpu = Serval::CpuRivals.cpu.to_s # the idlest CPU: "alone" means alone
    io = IO.popen(["taskset", "-c", cpu, RbConfig.ruby, "-I", lib, "-e", CHILD], "r+")
    assert_equal "alone\n", io.gets
    rival = Process.spawn("taskset", "-c", cpu, RbConfig.ruby, "-e", "loop {}")
    sleep 0.1 until File.read("/proc/#{rival}/stat").split[13].to_i.positive? # the rival has run
    io.puts "go"
    alone, shared = JSON.parse(io.gets)
    assert_operator median_speed(alone), :>, 0.85, "alone: #{alone.inspect}"
    assert_operator median_speed(shared), :<, 0.75, "shared with a busy process: #{shared.inspect}"
    assert(shared.all? { |_at, held, _cpu| held > 0.2 }, "the spinning thread holds the GVL every step")
    # the process's CPU holds its Ruby threads' (and the sampler's own)
    assert((alone + shared).all? { |_at, _held, cpu, proc| proc >= cpu - 0.002 }, (alone + shared).inspect)
    # the spinner is no request: its GVL time is held outside requests (5th
    # figure, counted when a slice ends, so a step gets whole slices of up to
    # ~0.3 s, and a group's first step may get time from before it: compared
    # summed, with room for a slice at each group's edge)
    steps = alone + shared
    outside = steps.sum { |st| st[4] }
    held = steps.sum { |st| st[1] }
    assert_operator outside, :>=, 0.75 * held, steps.inspect
    assert_operator outside, :<=, 1.25 * held, steps.inspect
    # 6th to 11th and 14th figures: the sampled in-request idle spans, 12th and 13th
    # the requests that ended in the step and their wall time (none here: no
    # requests; test/cpu_wait_test.rb serves some)
    assert(steps.all? { |st| st.size == 14 && st[5..].all?(&:zero?) }, steps.inspect)
  ensure
    Process.kill(:KILL, rival) if rival
    Process.wait(rival) if rival
    io&.close
  end

  # The 12th and 13th figures: requests that ended in the step (every one
  # window.c records) and their wall time, for Timing::Window's cpu_fit.
  def test_steps_count_the_requests_that_ended_in_them
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      Serval::Native::GVL.enable
      Serval::Timing.window_reset
      sleep 0.05 until Serval::Native::GVL.steadiness[1].size >= 1 # the sampler runs
      first = Serval::Native::GVL.steadiness[1].size
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      5.times { Serval::Timing.window_record(now, [0.001, 0.002, 0.003, 0.0, 0.0, 0.02, nil], 1) }
      sleep 0.05 until Serval::Native::GVL.steadiness[1].size >= first + 2 # a step ended after the five
      steps = Serval::Native::GVL.steadiness[1]
      writer.write(JSON.generate([steps.sum { |st| st[11] }, steps.sum { |st| st[12] }, steps.map(&:size).uniq]))
      writer.close
      exit!(0)
    end
    writer.close
    done, wall, sizes = JSON.parse(reader.read)
    assert_equal [14], sizes
    assert_equal 5, done
    assert_in_delta 0.1, wall, 1e-6
    Process.wait(pid)
  ensure
    reader&.close
  end

  def test_no_steps_before_the_hook_is_enabled_in_a_forked_child
    Serval::Native::GVL.enable
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      before = Serval::Native::GVL.steadiness[1].size
      Serval::Native::GVL.enable
      writer.write(before.to_s)
      writer.close
      exit!(0)
    end
    writer.close
    assert_equal "0", reader.read, "a child does not report its parent's steps"
    Process.wait(pid)
  ensure
    reader&.close
  end
end
