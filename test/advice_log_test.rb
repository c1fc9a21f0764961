# frozen_string_literal: true

require_relative "test_helper"
require "support/advice_windows"
require "serval/advice_log"
require "serval/launcher"
require "stringio"

# The advice log line: logged when advice first becomes available and when
# the decision changes, not on every check; computed on a thread of its own
# that exists only while a check runs.
class AdviceLogTest < Minitest::Test
  # Collects log lines.
  class Lines
    attr_reader :queue

    def initialize = @queue = Queue.new
    def info(line) = @queue << [:info, line]
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

  # Wired into Launcher#run: a launcher that has a window logs the line
  # after boot and stops the logger with itself. The supervising loop
  # starts each check on a thread that ends with it: between checks no
  # advice thread waits.
  def test_launcher_starts_and_stops_it
    lines = Queue.new
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:0"],
                                                                                  advice_log_interval: 1.0))
    launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: QueueIO.new(lines), stderr: QueueIO.new(lines)),
                                             app: ->(_env) { [200, {}, ["hi"]] }, signals: false)
    window = AdviceWindows.window(1200)
    checks = Queue.new
    launcher.define_singleton_method(:window) do
      checks << Thread.current
      window
    end
    thread = Thread.new { launcher.run }
    assert launcher.wait_until_booted(10)
    refute(Thread.list.any? { |t| t.name == "serval-advice" }, "no advice thread before the first check")
    line = nil
    line = lines.pop until line&.start_with?("advice: ")
    assert_match(/\Aadvice: \d+ threads(?: \(\d+-\d+\))? x \d+ processes \(cpu share 0\.\d\d from 1,200 requests; running 3 threads/, line)
    first = checks.pop
    assert_equal "serval-advice", first.name
    refute_equal thread, first, "not on the loop's thread"
    assert first.join(10), "the check's thread ends with the check"
    second = checks.pop # the next interval: a new thread
    refute_same first, second
    assert_equal "serval-advice", second.name
    launcher.stop
    assert_equal 0, thread.value
    refute(Thread.list.any? { |t| t.name == "serval-advice" && t.alive? }, "stopped with the launcher")
  end
end
