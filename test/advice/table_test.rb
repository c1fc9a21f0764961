# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "support/advice_windows"
require "serval/advice"
require "serval/advice/table"

# The text `servalctl advise` prints.
class AdviceTableTest < Minitest::Test
  MACHINE = { cpus: 2.0, cpu_source: "test", memory_bytes: 8 << 30, memory_source: "test", worker_bytes: 300 << 20 }.freeze
  T = Serval::Advice::Table

  def advice(n, **opts)
    Serval::Advice.recommend(AdviceWindows.window(n, **opts.slice(:db_pools)), machine: MACHINE, sim_requests: 4000, load_requests: 4000,
                                                                              **opts.except(:db_pools))
  end

  def test_sweep_table_and_recommendation
    a = advice(1500, target_rps: 300)
    text = T.render(a)
    lines = text.lines.map(&:chomp)
    head = lines.index { |l| l.start_with?("threads") }
    assert_equal %w[threads req/s gain stall mean p50 p99], lines[head].split
    rows = lines[head + 1, a[:sweep].size] # the sweep may stop past the knee (Sweep::MIN_ROWS..16 rows)
    assert_operator rows.size, :>=, Serval::Advice::Sweep::MIN_ROWS
    assert_equal (1..rows.size).map(&:to_s), rows.map { |l| l.split.first }
    assert_match(/\A1 +#{format('%.1f', a[:sweep][0][:rps])} +- /, rows[0], "no gain for one thread")
    second = a[:sweep][1]
    assert_includes rows[1], format("%+.1f %%", 100 * second[:gain])
    assert_includes rows[1], format("%.1f ms", second[:wall_p99] * 1e3)
    advised = rows.grep(/<- .*advised/)
    assert_equal 1, advised.size
    assert_equal a[:threads].to_s, advised.first.split.first
    assert_equal "3", rows.grep(/running/).first.split.first, "the window ran 3 threads"
    assert_includes text, "Advice: #{Serval::Advice::Recommender.threads_text(a)} x 2 processes per machine"
    assert_includes text, format("predicted max %.1f req/s per process", a[:max_rps_per_process])
    assert_includes text, "cpu share #{format('%.2f', a[:cpu_share])} from 1,500 requests (running 3 threads)"
    assert_match(/^  for 300 req\/s: \d+ machines x 2 processes x #{a[:threads]} threads/, text)
    assert_includes text, "\nWhy:\n  - throughput levels off at #{a[:knee]} threads"
  end

  def test_same_text_from_a_saved_json_answer
    a = advice(1200)
    assert_equal T.render(a), T.render(JSON.parse(JSON.generate(a)))
  end

  def test_pool_binds_marks_the_knee_and_warns
    a = advice(1500, db_pools: [{ name: "primary", size: 2 }], machines: 4, db_max_connections: 10)
    text = T.render(a)
    assert_equal 2, a[:threads]
    assert_match(/^2 .*<- advised$/, text)
    assert_match(/^#{a[:knee]} .*<- knee/, text)
    assert_includes text, "database: 2 connections per process, 4 per machine, 16 for 4 machines + 0 other " \
                          "(limit 10: does not fit)"
    assert_match(/^Warnings:\n  - the database pool binds/, text)
  end

  def test_too_little_data
    text = T.render(advice(40))
    assert_equal "No advice yet: 40 requests measured, need 300\n\nWarnings:\n  - 40 requests measured, need 300\n", text
  end
end
