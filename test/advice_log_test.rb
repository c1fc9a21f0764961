# frozen_string_literal: true

require_relative "test_helper"
require "support/advice_windows"
require "serval/advice_log"
require "serval/launcher"
require "serval/supervisor"
require "serval/auto/model_process"
require "support/model_gate"
require "stringio"

# The advice log line: logged when advice first becomes available and when
# the decision changes, not on every check; in single mode the supervising
# loop hands each check to the model child and logs the answer when it
# comes, with no thread of its own.
class AdviceLogTest < Minitest::Test
  # Collects log lines.
  class Lines
    attr_reader :queue

    def initialize = @queue = Queue.new
    def info(line) = @queue << [:info, line]
    def warn(line) = @queue << [:warn, line]
    def error(line) = @queue << [:error, line]
    def exception(err, msg) = @queue << [:error, "#{msg}: #{err.message}"]
  end

  # Stands in for Serval::Launcher.
  class Launcher
    attr_accessor :window, :booted
    attr_writer :stats

    def initialize(window) = @window = window
    def stats = @stats || {}
    def wait_until_booted(_timeout) = true
  end

  def setup
    @log = Lines.new
  end

  def log_for(launcher, interval: 60)
    Serval::AdviceLog.new(launcher, interval: interval, log_writer: @log)
  end

  def test_first_advice_then_only_changes
    launcher = Launcher.new(AdviceWindows.window(200))
    log = log_for(launcher)
    assert_nil log.check, "too little data: no line"
    launcher.window = AdviceWindows.window(1500)
    line = log.check
    assert_match(/\Aadvice: \d+ threads(?: \(\d+-\d+\))? x \d+ processes \(cpu share 0\.3\d from 1,500 requests; running 3 threads, stall p95 \d+ ms\)\z/,
                 line)
    assert_equal [:info, line], @log.queue.pop
    launcher.window = AdviceWindows.window(1600, seed: 12)
    assert_nil log.check, "same decision, new figures: no line"
    launcher.window = AdviceWindows.window(1500, run: 0.014, idle: 0.006) # 70 % CPU: fewer threads
    changed = log.check
    refute_nil changed
    refute_equal line[/\d+ threads/], changed[/\d+ threads/]
    was = line[/\d+ threads(?: \(\d+-\d+\))? x \d+ processes/]
    assert changed.end_with?("; was #{was}: cpu share #{line[/cpu share (0\.\d\d)/, 1]} -> #{changed[/cpu share (0\.\d\d)/, 1]}"),
           changed
    assert_equal [:info, changed], @log.queue.pop
    assert @log.queue.empty?
  end

  # A small heap's back-to-back major GCs (the window's gc figures): one
  # warning line when they appear, none while they go on, another when they
  # come back after a window without them.
  def test_back_to_back_major_gcs_are_warned_of_once
    runaway = { seconds: 50.0, majors: 400, nofree: 400, heap: { index: 0, slot_size: 40, slots: 40_933 } }
    launcher = Launcher.new(AdviceWindows.window(1500, gc: runaway))
    log = log_for(launcher)
    line = log.check
    warned = @log.queue.pop
    assert_equal :warn, warned[0]
    assert_match(/\Aadvice: major GCs: 8\.0 a second over 50 s, 100 % .*RUBY_GC_HEAP_0_INIT_SLOTS=170000/, warned[1])
    assert_equal [:info, line], @log.queue.pop
    log.check
    assert @log.queue.empty?, "the same warning again: no line"
    launcher.window = AdviceWindows.window(1500, gc: runaway.merge(majors: 20, nofree: 20))
    log.check
    assert @log.queue.empty?, "calm: no line"
    launcher.window = AdviceWindows.window(1500, gc: runaway)
    log.check
    assert_equal :warn, @log.queue.pop[0], "back: warned again"
  end

  # With threads :auto the line's thread count is auto's, read from its
  # stats (single mode: the server's; cluster: each worker's check-in), and
  # a change of auto's count alone logs nothing new: auto logs its changes.
  def test_with_threads_auto_the_line_gives_autos_decision
    launcher = Launcher.new(AdviceWindows.window(1500, run: 0.014, idle: 0.006))
    auto = { target_threads: 5, model_threads: 2, model_open_threads: 3 }
    launcher.stats = { auto: auto }
    log = log_for(launcher)
    line = log.check
    assert_match(/\Aadvice: \d+ process(es)?; threads :auto runs 5 threads \(its model: knee 2, part-load target 3; cpu share 0\.\d+ from 1,500 requests\)\z/,
                 line)
    refute_match(/\d+ threads x/, line, "no second thread count beside auto's")
    # the counts auto holds at part load, when it has them: its count is among them
    held = log_for(Launcher.new(AdviceWindows.window(1500, run: 0.014, idle: 0.006)).tap do |l|
      l.stats = { auto: auto.merge(target_threads: 4, model_open_threads: 4, model_open_range: [3, 5]) }
    end).check
    assert_match(/threads :auto runs 4 threads \(its model: knee 2, part-load target 4, held 3-5; cpu share/, held)
    auto[:target_threads] = 3
    assert_nil log.check, "auto's own change is auto's line (threads: 5 -> 3)"
    workers = [{ last_status: { auto: { target_threads: 3, model_threads: 3 } } },
               { last_status: { auto: { target_threads: 4, model_threads: 3 } } }]
    launcher.stats = { worker_status: workers }
    line = log_for(launcher).check
    assert_match(/threads :auto runs 3\/4 threads \(its model: knee 3; /, line)
  end

  # What #start gives it: the check in a child process at nice 19, the same
  # line as in this process.
  def test_the_check_runs_in_a_child_process
    require "serval/auto/model_process"
    runner = Serval::Auto::ModelProcess.new(timeout: 60)
    launcher = Launcher.new(AdviceWindows.window(1500))
    here = log_for(launcher).check
    there = Serval::AdviceLog.new(launcher, interval: 60, log_writer: Lines.new, runner: runner).check
    refute_nil runner.pid, "the child ran it"
    assert_equal here, there
  ensure
    runner&.stop
  end

  # A runner that fails: the check is made here and still logged.
  def test_a_failing_child_falls_back_to_this_process
    failing = Object.new
    def failing.advice(*, **) = raise(Serval::ModelProcessError, "model process: gone")
    line = Serval::AdviceLog.new(Launcher.new(AdviceWindows.window(1500)), interval: 60, log_writer: @log,
                                                                           runner: failing).check
    assert_match(/\Aadvice: \d+ threads/, line)
  end

  def test_failure_is_logged_once
    launcher = Launcher.new({ requests: 1500, samples: [{ nothing: 1 }] * 1500 })
    log = log_for(launcher)
    2.times { assert_nil log.check }
    kind, line = @log.queue.pop
    assert_equal :error, kind
    assert_match(/\Aserval: advice failed \(ArgumentError: a sample needs run and idle/, line)
    assert @log.queue.empty?, "the same failure is not logged again"
  end

  def test_runs_on_its_own_thread_and_stops
    log = log_for(Launcher.new(AdviceWindows.window(1200)), interval: 1.0).start
    kind, line = @log.queue.pop
    assert_equal :info, kind
    assert_match(/\Aadvice: /, line)
    log.stop
    refute(Thread.list.any? { |t| t.name == "serval-advice" && t.alive? })
  end

  def test_wanted_only_with_a_window_and_an_interval
    with_window = Struct.new(:options) { def window = nil }
    without = Struct.new(:options)
    assert Serval::AdviceLog.wanted?(with_window.new({ advice_log_interval: 60.0 }))
    refute Serval::AdviceLog.wanted?(with_window.new({ advice_log_interval: 0.0 }))
    refute Serval::AdviceLog.wanted?(without.new({ advice_log_interval: 60.0 }))
  end

  # Stands in for the supervising loop (Supervisor#every and #watch): #turn
  # waits (bounded) for a watched IO and runs its block.
  class Loop < Launcher
    attr_reader :jobs, :watches

    def initialize(window)
      super
      @jobs = []
      @watches = []
    end

    def options = { workers: 0 }
    def every(interval, &block) = Serval::Supervisor::Job.new(interval, block).tap { |j| @jobs << j }
    def watch(io, &block) = Serval::Supervisor::Watch.new(io, block).tap { |w| @watches << w }

    def live = @watches.reject { |w| w.stopped || w.io.closed? }

    def turn(timeout: 60)
      ready, = IO.select(live.map(&:io), nil, nil, timeout)
      raise "nothing readable in #{timeout} s" unless ready

      live.each { |w| w.block.call if ready.include?(w.io) }
    end

    # Turns until nothing is watched (the check ended).
    def finish(timeout: 60) = (turn(timeout: timeout) until live.empty?)
  end

  # Single mode: the loop's tick hands the window to the child and watches
  # its answer; the line is the one #check gives.
  def test_on_the_loop_a_check_is_submitted_and_its_answer_logged
    loop = Loop.new(AdviceWindows.window(1500))
    want = log_for(Launcher.new(loop.window)).check
    @log.queue.clear
    log = log_for(loop, interval: 1.0).start
    assert_equal 1, loop.jobs.size, "one job: the tick"
    assert_empty loop.watches, "nothing watched between checks"
    loop.jobs.first.block.call
    assert_equal 1, loop.live.size, "the child's answer watched"
    refute(Thread.list.any? { |t| t.name == "serval-advice" }, "no thread")
    loop.finish
    assert_equal [:info, want], @log.queue.pop
    loop.jobs.first.block.call # the next check: the same decision, no line
    loop.finish
    assert @log.queue.empty?
  ensure
    log&.stop
  end

  # A cluster master's loop: the window arrives later (Cluster#window_later),
  # when the test hands it over, as the loop would once the workers answered.
  class ClusterLoop < Loop
    Asking = Struct.new(:block, :cancelled) do
      def ended? = cancelled || block.nil?
      def cancel = self.cancelled = true
    end

    attr_reader :asks

    def initialize(window)
      super
      @asks = []
    end

    def options = { workers: 2 }
    def window = raise("the loop never waits for the workers' windows")

    def window_later(&block)
      Asking.new(block).tap { |a| @asks << a }
    end

    # The workers answered: the block runs (on the loop) with the merged window.
    def answer(asking)
      block = asking.block
      asking.block = nil
      block.call(@window)
    end
  end

  # Cluster mode: the tick asks the workers and returns at once; a tick
  # while they answer is skipped; their window goes to the child and the
  # line is logged when it answers. No thread.
  def test_on_a_cluster_loop_the_window_is_asked_and_the_check_goes_on_when_it_comes
    loop = ClusterLoop.new(AdviceWindows.window(1500).merge(per_process: [{ index: 0, pid: Process.pid, requests: 1500 }]))
    log = log_for(loop, interval: 1.0).start
    assert_nil loop.jobs.first.block.call, "the workers are asked; nothing for the child yet"
    assert_equal 1, loop.asks.size
    assert_empty loop.watches
    loop.jobs.first.block.call
    assert_equal 1, loop.asks.size, "asking still: this tick is skipped"
    refute(Thread.list.any? { |t| t.name == "serval-advice" }, "no thread")
    loop.answer(loop.asks.first)
    assert_equal 1, loop.live.size, "the child's answer watched"
    loop.finish
    kind, line = @log.queue.pop
    assert_equal :info, kind
    assert_match(/\Aadvice: \d+ threads/, line)
    loop.jobs.first.block.call
    assert_equal 2, loop.asks.size, "the next check asks again"
    log.stop
    assert loop.asks.last.cancelled, "a stop ends the ask in progress"
  ensure
    log&.stop
  end

  # No request yet (an idle server, or a cluster before its workers
  # booted): nothing is handed to the child, which is not started.
  def test_a_window_without_requests_starts_no_child
    loop = Loop.new(AdviceWindows.window(1500).merge(requests: 0))
    runner = Serval::Auto::ModelProcess.new(child: ModelGate::CHILD)
    log = Serval::AdviceLog.new(loop, interval: 1.0, log_writer: @log, runner: runner).start
    assert_nil log.tick
    assert_empty loop.watches
    assert_nil runner.instance_variable_get(:@pid), "no child"
    loop.window = AdviceWindows.window(1500)
    refute_nil log.tick, "the first window with requests starts it"
  ensure
    log&.stop
  end

  # The child does not answer: the tick after its deadline gives it up
  # (logged once however often it happens), and starts the next check, which
  # works; a tick before the deadline leaves the check running.
  def test_a_hung_child_times_out_is_logged_once_and_the_next_check_works
    gate = ModelGate.new
    loop = Loop.new(AdviceWindows.window(1500).merge(gate: gate.path))
    runner = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    log = Serval::AdviceLog.new(loop, interval: 1.0, log_writer: @log, runner: runner).start
    first = log.tick
    _, hung = gate.accept
    assert_nil log.tick(first.deadline - 1), "not late: this tick is skipped"
    second = log.tick(first.deadline)
    kind, line = @log.queue.pop
    assert_equal :error, kind
    assert_equal "serval: advice failed (Serval::ModelProcessTimeout: model process: no answer in 60 s)", line
    assert_raises(Errno::ESRCH) { Process.kill(0, hung) }
    refute_nil second, "the next check started"
    gate.accept
    loop.window = AdviceWindows.window(1500) # no gate: the child after this one answers at once
    third = log.tick(second.deadline)
    refute_nil third
    loop.finish
    kind, line = @log.queue.pop
    assert_equal :info, kind, "the same timeout is not logged again"
    assert_match(/\Aadvice: \d+ threads/, line)
    assert @log.queue.empty?
  ensure
    log&.stop
    gate&.close
  end

  # A child that fails: logged, not computed in the loop's process instead
  # (it would hold the loop); the next check starts a new child.
  def test_a_failing_child_on_the_loop_is_logged
    loop = Loop.new({ requests: 1500, samples: [{ nothing: 1 }] * 1500 })
    log = log_for(loop, interval: 1.0).start
    log.tick
    loop.finish
    kind, line = @log.queue.pop
    assert_equal :error, kind
    assert_match(/\Aserval: advice failed \(Serval::ModelProcessError: ArgumentError: a sample needs run and idle/, line)
    loop.window = AdviceWindows.window(1500)
    log.tick
    loop.finish
    assert_equal :info, @log.queue.pop.first
  ensure
    log&.stop
  end

  # #stop during a check: the child killed at once, nothing left watched.
  def test_stop_ends_a_check_in_flight
    gate = ModelGate.new
    loop = Loop.new(AdviceWindows.window(1500).merge(gate: gate.path))
    runner = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    log = Serval::AdviceLog.new(loop, interval: 1.0, log_writer: @log, runner: runner).start
    request = log.tick
    _, pid = gate.accept
    log.stop
    assert_empty loop.live, "the loop watches nothing"
    assert request.io.closed?
    assert_raises(Errno::ESRCH) { Process.kill(0, pid) }
    assert @log.queue.empty?
  ensure
    gate&.close
  end

  # An IO that hands every write to a queue.
  class QueueIO < StringIO
    def initialize(queue)
      super()
      @queue = queue
    end

    def write(text)
      @queue << text
      super
    end
  end

  def launcher_with(lines, interval)
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:0"],
                                                                                  advice_log_interval: interval))
    Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: QueueIO.new(lines), stderr: QueueIO.new(lines)),
                                  app: ->(_env) { [200, {}, ["hi"]] }, signals: false)
  end

  # Wired into Launcher#run: a launcher that has a window logs the line
  # after boot and stops the logger with itself. In single mode the
  # supervising loop reads the window itself: no advice thread, ever.
  def test_launcher_starts_and_stops_it
    lines = Queue.new
    launcher = launcher_with(lines, 1.0)
    window = AdviceWindows.window(1200)
    checks = Queue.new
    launcher.define_singleton_method(:window) do
      checks << Thread.current
      window
    end
    thread = Thread.new { launcher.run }
    assert launcher.wait_until_booted(10)
    line = nil
    line = lines.pop until line&.start_with?("advice: ")
    assert_match(/\Aadvice: \d+ threads(?: \(\d+-\d+\))? x \d+ processes \(cpu share 0\.\d\d from 1,200 requests; running 3 threads/, line)
    assert_same thread, checks.pop, "on the loop's thread"
    assert_same thread, checks.pop, "the next interval: the loop again"
    refute(Thread.list.any? { |t| t.name == "serval-advice" }, "no advice thread")
    launcher.stop
    assert_equal 0, thread.value
  end

  # The child takes its time (held at the gate): the loop serves commands
  # meanwhile, and a stop is prompt, the check given up.
  def test_the_loop_serves_commands_while_the_child_is_slow
    gate = ModelGate.new
    lines = Queue.new
    launcher = launcher_with(lines, 0.0) # the log below, with a child held at the gate
    window = AdviceWindows.window(1200).merge(gate: gate.path)
    launcher.define_singleton_method(:window) { window }
    runner = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    log = Serval::AdviceLog.new(launcher, interval: 1.0, log_writer: launcher.log_writer, runner: runner).start
    thread = Thread.new { launcher.run }
    child, = gate.accept # a check in flight
    launcher.enqueue(:dump_threads)
    dump = nil
    dump = lines.pop until dump&.match?(/\Aserval\[\d+\] thread /)
    refute(Thread.list.any? { |t| t.name == "serval-advice" }, "no advice thread")
    gate.release(child)
    line = nil
    line = lines.pop until line&.start_with?("advice: ")
    _, pid = gate.accept # the next check, held
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    launcher.stop
    assert_equal 0, thread.join(10)&.value, "stopped while the child is held"
    log.stop
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    assert_raises(Errno::ESRCH) { Process.kill(0, pid) }
  ensure
    log&.stop
    gate&.close
  end
end
