# frozen_string_literal: true

# bench/lib/bench/report.rb: `bench/run --docs` writes its tables between the
# markers of docs/benchmarks/latest.md and leaves the text around them alone;
# the file in the repository has the markers and is what latest.json makes.
# (Each test is bounded by test_helper's per-test deadline.)
require_relative "test_helper"
require "json"
require "tmpdir"
require_relative "../bench/lib/bench"

class BenchReportTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  MARKS = [Bench::Report::BEGIN_MARK, Bench::Report::END_MARK].freeze

  def setup
    @ctx = Bench::Context.new(File.join(ROOT, "bench"), io: StringIO.new)
    @latest = JSON.parse(File.read(File.join(ROOT, "bench", "results", "latest.json")))
  end

  def teardown
    @ctx.cleanup
  end

  def report(docs)
    Bench::Report.new(@ctx, @latest, json_path: File.join(ROOT, "bench", "results", "latest.json"),
                                     docs: docs, chart_dir: File.dirname(docs))
  end

  def generated(text)
    text[/#{Regexp.escape(MARKS[0])}\n(.*)\n#{Regexp.escape(MARKS[1])}/m, 1]
  end

  def test_the_repository_file_has_one_pair_of_markers_and_the_section_latest_json_makes
    path = File.join(ROOT, Bench::Report::DOCS)
    text = File.read(path)
    MARKS.each { |m| assert_equal 1, text.scan(m).size, "#{Bench::Report::DOCS}: #{m}" }
    section = report(path).markdown({})
    assert section.start_with?("## Latest full run"), section[0, 200]
    assert_equal @latest["workloads"].size, section.scan(/^Command: `BENCH_DURATION=/).size
    # bench/run without --out rewrites latest.json: compare only while it is
    # still the run the committed file shows.
    return unless text.include?(" on #{@latest['timestamp']} ")

    headings = ->(s) { s.lines(chomp: true).grep(/\A(###|Command:)/) }
    assert_equal headings.(generated(text)), headings.(section)
  end

  def test_a_new_file_gets_a_header_and_the_section
    Dir.mktmpdir("bench-report") do |dir|
      docs = File.join(dir, "sub", "latest.md")
      report(docs).place("## first")
      text = File.read(docs)
      assert text.start_with?("# Benchmarks"), text
      assert_equal "## first", generated(text)
    end
  end

  def test_text_outside_the_markers_stays_and_only_the_section_changes
    Dir.mktmpdir("bench-report") do |dir|
      docs = File.join(dir, "latest.md")
      File.write(docs, "# Mine\n\nbefore\n\n#{MARKS[0]}\nold\n#{MARKS[1]}\n\nafter\n")
      report(docs).place("new\ntables")
      assert_equal "# Mine\n\nbefore\n\n#{MARKS[0]}\nnew\ntables\n#{MARKS[1]}\n\nafter\n", File.read(docs)
    end
  end

  def test_charts_are_linked_relative_to_the_docs_file
    Dir.mktmpdir("bench-report") do |dir|
      docs = File.join(dir, "docs", "latest.md")
      png = File.join(dir, "docs", "hello.png")
      section = report(docs).markdown({ "hello:hello" => png })
      assert_includes section, "![hello:hello](hello.png)"
      nested = Bench::Report.new(@ctx, @latest, json_path: "x.json", docs: File.join(dir, "bench", "NOTES.md"))
      assert_includes nested.markdown({ "hello:hello" => png }), "![hello:hello](../docs/hello.png)"
    end
  end
end
