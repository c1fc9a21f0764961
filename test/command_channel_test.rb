# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "serval/launcher"
require "serval/cluster"

# The master <-> worker request channel, both ends in this process: a
# Responder per fake worker on one end of a socket pair, the Asker on the other.
class CommandChannelTest < Minitest::Test
  Handle = Struct.new(:index, :pid, :control_io, :replies)
  Channel = Serval::Cluster::CommandChannel

  def setup
    @pairs = []
    @log = Serval::LogWriter.new(stdout: StringIO.new, stderr: StringIO.new)
  end

  def teardown
    @pairs.flatten.each { |io| io.close unless io.closed? }
  end

  # A fake worker: a handle for the Asker and a Responder reading on a thread
  # until EOF (the master gone).
  def worker(index, handlers)
    master, child = Channel.pair
    @pairs << [master, child]
    responder = Channel::Responder.new(child, handlers, @log)
    reader = Thread.new do
      loop do
        child.wait_readable
        break unless responder.read
      end
    rescue IOError
      nil # teardown closed it
    end
    [Handle.new(index, 1000 + index, master, Channel::Reader.new(master)), reader]
  end

  def test_every_worker_answers_in_handle_order
    handles = [2, 0].map { |i| worker(i, echo: ->(r) { { index: i, got: r[:value] } }).first }
    answers, missing = Channel::Asker.new.ask(handles, :echo, 5, value: "x")
    assert_empty missing
    assert_equal [{ index: 2, pid: 1002, result: { index: 2, got: "x" } },
                  { index: 0, pid: 1000, result: { index: 0, got: "x" } }], answers
  end

  def test_a_silent_worker_is_reported_and_does_not_hold_up_the_answer
    release = Queue.new
    ok, = worker(0, ask: ->(_r) { "fine" })
    stuck, = worker(1, ask: ->(_r) { release.pop })
    answers, missing = Channel::Asker.new.ask([ok, stuck], :ask, 0.3)
    assert_equal [{ index: 0, pid: 1000, result: "fine" }], answers
    assert_equal [{ index: 1, pid: 1001, error: "no answer within 0.3s" }], missing
  ensure
    release&.push("late")
  end

  # Asker#start (the master's loop): the request is out at once, each
  # answer is read when its channel is readable, never waiting; a worker
  # that does not answer is missing once the deadline passed.
  def test_an_ask_that_never_waits
    release = Queue.new
    ok, = worker(0, ask: ->(_r) { "fine" })
    stuck, = worker(1, ask: ->(_r) { release.pop })
    asker = Channel::Asker.new
    asking = asker.start([ok, stuck], :ask, 60)
    assert_equal [ok.control_io, stuck.control_io], asking.ios
    ok.control_io.wait_readable(10)
    refute asking.read(ok.control_io), "worker 1 has yet to answer"
    assert_equal [stuck.control_io], asking.ios
    refute asking.read(stuck.control_io), "nothing from it: read does not wait"
    assert asking.done?(asking.deadline), "the deadline passed"
    answers, missing = asking.result
    assert_equal [{ index: 0, pid: 1000, result: "fine" }], answers
    assert_equal [{ index: 1, pid: 1001, error: "no answer within 60.0s" }], missing
    assert asking.ended?
    refute_nil asker.start([ok], :ask, 60), "the channels are free again"
  ensure
    release&.push("late")
  end

  # A worker reaped meanwhile (the loop closed its channel): it is missing,
  # and the ask ends without it.
  def test_a_closed_channel_ends_the_ask
    handle, = worker(0, ask: ->(_r) { Queue.new.pop })
    asking = Channel::Asker.new.start([handle], :ask, 60)
    handle.control_io.close
    assert asking.done?
    assert_equal [[], [{ index: 0, pid: 1000, error: "exited before answering" }]], asking.result
  end

  # One ask at a time: #start finds the channels busy (nil); #ask waits for
  # the ask in progress to end, within its timeout, then asks.
  def test_asks_take_turns
    handle, = worker(0, ask: ->(_r) { "fine" })
    asker = Channel::Asker.new
    asking = asker.start([handle], :ask, 60)
    ended = Queue.new
    asking.on_end { ended << :ended }
    assert_nil asker.start([handle], :ask, 60), "busy"
    assert_equal [[], [{ index: 0, pid: 1000, error: "the command channels stayed busy" }]],
                 asker.ask([handle], :ask, 0.05)
    waiting = Thread.new { asker.ask([handle], :ask, 30) }
    Thread.pass until waiting.status == "sleep" || !waiting.alive?
    asking.cancel
    assert_equal :ended, ended.pop
    answers, missing = waiting.value
    assert_empty missing
    assert_equal ["fine"], answers.map { |a| a[:result] }
  end

  def test_a_late_answer_is_dropped_by_the_next_request
    gate = Queue.new
    calls = 0
    handle, = worker(0, ask: lambda do |_r|
      calls += 1
      gate.pop if calls == 1
      "answer #{calls}"
    end)
    asker = Channel::Asker.new
    _, missing = asker.ask([handle], :ask, 0.2)
    assert_equal 1, missing.size
    gate << :go # the first answer now arrives, late
    answers, missing = asker.ask([handle], :ask, 5)
    assert_empty missing
    assert_equal ["answer 2"], answers.map { |a| a[:result] }
  end

  def test_errors_and_unknown_commands_and_a_gone_worker
    broken, = worker(0, fail: ->(_r) { raise NotImplementedError, "needs 3.2" })
    answers, missing = Channel::Asker.new.ask([broken], :fail, 5)
    assert_empty answers
    assert_equal "NotImplementedError: needs 3.2", missing.first[:error]
    _, missing = Channel::Asker.new.ask([broken], :nope, 5)
    assert_equal "unknown command \"nope\"", missing.first[:error]

    master, child = Channel.pair
    @pairs << [master, child]
    child.close # the worker exited
    _, missing = Channel::Asker.new.ask([Handle.new(1, 1001, master, Channel::Reader.new(master))], :anything, 5)
    assert_match(/exited before answering|not reachable/, missing.first[:error])
  end

  def test_the_responder_sees_the_master_go
    _, reader = worker(0, {})
    @pairs.last.first.close
    assert reader.join(5), "the responder reports EOF"
  end

  # A large answer (a trace is megabytes) arrives whole, split over many
  # reads; a payload travels beside the result as unparsed text.
  def test_large_answer_and_payload
    big = "x" * 3_000_000
    handle, = worker(0, big: ->(_r) { big }, bulk: ->(r) { Channel::Bulk.new({ n: r[:n] }, "[#{'1,' * 1_500_000}1]") })
    answers, missing = Channel::Asker.new.ask([handle], :big, 10)
    assert_empty missing
    assert_equal big.bytesize, answers.first[:result].bytesize
    refute answers.first.key?(:payload)
    answers, missing = Channel::Asker.new.ask([handle], :bulk, 10, n: 3)
    assert_empty missing
    assert_equal({ n: 3 }, answers.first[:result])
    assert_equal 3_000_003, answers.first[:payload].bytesize
    assert_equal 1_500_001, JSON.parse(answers.first[:payload]).size
  end

  # A late answer with a payload is dropped whole (header and payload line).
  def test_a_late_payload_is_dropped_whole
    gate = Queue.new
    calls = 0
    handle, = worker(0, bulk: lambda do |_r|
      calls += 1
      gate.pop if calls == 1
      Channel::Bulk.new(calls, "[#{calls}]")
    end)
    asker = Channel::Asker.new
    assert_equal 1, asker.ask([handle], :bulk, 0.2).last.size
    gate << :go
    answers, = asker.ask([handle], :bulk, 5)
    assert_equal [[2, "[2]"]], answers.map { |a| [a[:result], a[:payload]] }
  end
end
