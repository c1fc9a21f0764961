# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "tmpdir"
require "support/advice_windows"
require "support/png"
require "serval/advice"
require "serval/advice/report"

# The HTML report of `servalctl advise --html`: self-contained (nothing
# fetched, no scripts), with its charts, and rendered for real by headless
# Chromium: the charts' colours are on the screenshot, and a report with no
# charts has none of them.
class AdviceReportTest < Minitest::Test
  MACHINE = { cpus: 2.0, cpu_source: "test", memory_bytes: 8 << 30, memory_source: "test", worker_bytes: 300 << 20 }.freeze
  R = Serval::Advice::Report

  def advice(window, **opts)
    JSON.parse(JSON.generate(Serval::Advice.recommend(window, machine: MACHINE, sim_requests: 4000, load_requests: 4000, **opts)))
  end

  def full
    @full ||= begin
      win = AdviceWindows.window(1500, db_pools: [{ name: "primary", size: 3 }])
      [advice(win, machines: 2, db_max_connections: 10), win]
    end
  end

  def test_self_contained_with_every_chart
    a, win = full
    html = R.new(a, window: win).html
    assert_equal 5, html.scan("<svg").size, "throughput, latency, mean split, distribution, connections"
    refute_match(/<script|<link|<img|<iframe|@import|url\(|\bsrc=|\bhref=/i, html)
    assert_equal ["http://www.w3.org/2000/svg"], html.scan(%r{https?://[^"' ]+}).uniq, "only the SVG namespace"
    assert_includes html, "#{Serval::Advice::Recommender.threads_text(a.transform_keys(&:to_sym))} x #{a['processes']} processes per machine"
    assert_includes html, "Throughput against threads"
    assert_includes html, "Database connections - the pool binds"
    assert_includes html, CGI.escapeHTML(a["warnings"].first)
    assert_includes html, %(<tr class="advised"><td>#{a['threads']}</td>)
  end

  def test_text_is_escaped
    a, = full
    a = a.merge("warnings" => ["<b>pool</b> & co"])
    html = R.new(a).html
    assert_includes html, "&lt;b&gt;pool&lt;/b&gt; &amp; co"
    refute_includes html, "<b>pool</b>"
  end

  def test_from_histograms
    win = { requests: 2000, max_threads: 4, gvl_split: true,
            histograms: { run: { bounds: [0.002, 0.005, 0.01, 0.02], counts: [400, 800, 500, 250, 50] },
                          idle: { bounds: [0.005, 0.01, 0.05], counts: [300, 600, 1000, 100] } } }
    html = R.new(advice(win), window: win).html
    assert_includes html, "Per request: run / idle (2000 measured)"
    assert_equal 5, html.scan("<svg").size
    assert_includes html, "per machine"
    refute_includes html, "pool (measured)", "no pool in the window"
  end

  def test_too_little_data_has_no_charts
    win = AdviceWindows.window(30)
    html = R.new(advice(win), window: nil).html
    assert_includes html, "No advice yet"
    assert_includes html, "30 requests measured, need 300"
    refute_includes html, "<svg"
  end

  CHART_AREA = [0, 220, 1200, 1200].freeze # below the headline box

  def chart_colours = R::COLORS.values_at(:predicted, :p99, :p50, :idle).map { |c| c.delete("#").to_i(16) }

  def test_rendered_in_headless_chromium
    a, win = full
    hist = screenshot(R.new(a, window: win).html).histogram(*CHART_AREA)
    chart_colours.each { |c| assert_operator hist[c], :>, 200, format("#%06x is drawn on the report", c) }
    assert_operator colourful(hist), :>, 20_000, "the charts are drawn in colour"
  end

  # The baseline: the same page without charts has none of their colours.
  def test_rendered_without_charts_in_headless_chromium
    hist = screenshot(R.new(advice(AdviceWindows.window(30))).html).histogram(*CHART_AREA)
    chart_colours.each { |c| assert_equal 0, hist[c], format("#%06x is not on a report with no charts", c) }
    assert_operator colourful(hist), :<, 1000, "text is grey"
    assert_operator hist.size, :>, 2, "the page is not blank: the text is there"
  end

  private

  # Pixels whose channels differ a lot (not white, grey or black).
  def colourful(hist)
    hist.sum { |c, n| [c >> 16, (c >> 8) & 0xff, c & 0xff].then { |v| v.max - v.min > 60 ? n : 0 } }
  end

  def chromium
    @chromium ||= %w[chromium chromium-browser google-chrome].find { |c| system("command -v #{c} >/dev/null 2>&1") } ||
                  skip("headless Chromium is not installed (Debian: apt-get install chromium)")
  end

  def screenshot(html)
    Dir.mktmpdir("serval-report") do |dir|
      File.write(File.join(dir, "report.html"), html)
      png = File.join(dir, "out.png")
      pid = Process.spawn(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--user-data-dir=#{dir}/profile", "--screenshot=#{png}", "--window-size=1200,1200",
                          "file://#{dir}/report.html", out: File::NULL, err: File::NULL, pgroup: true)
      begin
        Process.wait(pid)
      ensure
        begin
          Process.kill("KILL", -pid) # the renderer children too, also when the suite's timeout fires
        rescue Errno::ESRCH
          nil
        end
      end
      assert File.size?(png), "chromium wrote no screenshot"
      PNGImage.new(File.binread(png))
    end
  end
end
