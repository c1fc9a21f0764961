# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "serval/gvl_trace"

# GVLTrace.merge: the workers' parts (events as JSON text) spliced into one
# Chrome trace, one process per worker. Pure Ruby: runs on every Ruby.
class GVLTraceMergeTest < Minitest::Test
  def part(index, pid, events, seconds: 1.0, dropped: 0)
    { index: index, pid: pid, result: { seconds: seconds, dropped_events: dropped, ruby: RUBY_VERSION },
      payload: JSON.generate(events) }
  end

  def slice(pid, tid, ts, ph = "B")
    { name: "running", cat: "gvl", ph: ph, pid: pid, tid: tid, ts: ts }
  end

  def test_two_workers_and_one_missing
    answers = [part(0, 101, [slice(101, 7, 1.5), slice(101, 7, 9.0, "E")], seconds: 1.0, dropped: 2),
               part(1, 102, [slice(102, 8, 2.5), slice(102, 8, 8.0, "E")], seconds: 1.25, dropped: 3)]
    missing = [{ index: 2, pid: 103, error: "no answer within 11.0s" }]
    text = Serval::GVLTrace.merge(answers, missing)
    assert_equal Encoding::UTF_8, text.encoding
    trace = JSON.parse(text)
    events = trace["traceEvents"]
    assert_equal({ 101 => "worker 0", 102 => "worker 1" },
                 events.select { |e| e["name"] == "process_name" }.to_h { |e| [e["pid"], e["args"]["name"]] })
    slices = events.reject { |e| e["ph"] == "M" }
    assert_equal [[101, 1.5], [101, 9.0], [102, 2.5], [102, 8.0]], slices.map { |e| [e["pid"], e["ts"]] }
    assert_equal "ms", trace["displayTimeUnit"]
    other = trace["otherData"]
    assert_equal [1.25, 5], [other["seconds"], other["dropped_events"]]
    assert_equal [[0, 101], [1, 102]], other["workers"].map { |w| [w["index"], w["pid"]] }
    assert_equal [{ "index" => 2, "pid" => 103, "error" => "no answer within 11.0s" }], other["missing"]
  end

  def test_empty_and_malformed_parts
    answers = [part(0, 101, []), { index: 1, pid: 102, result: {}, payload: nil }]
    trace = JSON.parse(Serval::GVLTrace.merge(answers, []))
    assert_equal [101], trace["traceEvents"].map { |e| e["pid"] }.uniq
    assert_equal [{ "index" => 1, "pid" => 102, "error" => "sent no trace events" }], trace["otherData"]["missing"]
    assert_equal({ "traceEvents" => [], "displayTimeUnit" => "ms" },
                 JSON.parse(Serval::GVLTrace.merge([], [])).slice("traceEvents", "displayTimeUnit"))
  end

  def test_non_ascii_thread_names_survive
    events = [{ name: "thread_name", ph: "M", pid: 101, tid: 7, args: { name: "wörker-ß" } }]
    trace = JSON.parse(Serval::GVLTrace.merge([part(0, 101, events)], [{ index: 1, pid: 102, error: "ünknown" }]))
    assert_includes trace["traceEvents"].map { |e| e["args"]&.dig("name") }, "wörker-ß"
    assert_equal "ünknown", trace["otherData"]["missing"].first["error"]
  end
end
