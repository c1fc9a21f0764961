# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice/svg"

# The report's labels stay clear of each other and of the lines: the
# horizontal line's label moves off the curve, legends wrap, long category
# names go on two lines.
class AdviceSvgLayoutTest < Minitest::Test
  S = Serval::Advice::Svg

  def test_hline_label_leaves_the_curve
    # a curve that levels off along the ceiling at the right: the right end is taken
    points = (1..16).map { |t| [t, 190.0 * (1 - Math.exp(-t / 2.0))] }
    svg = S.line_chart(title: "t", x_label: "x", y_label: "y", x_max: 16,
                       series: [{ name: "rps", color: "#000", points: points }],
                       hlines: [{ y: 189.0, label: "GVL ceiling 1 / run = 189 req/s", color: "#777" }])
    x, y, anchor = svg.match(/<text x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)" class="note"[^>]*>GVL ceiling/).captures
    assert_equal "start", anchor, "the left end, where the curve is low"
    box = S.box(Float(x), Float(y), "GVL ceiling 1 / run = 189 req/s")
    circles = svg.scan(/<circle cx="([\d.]+)" cy="([\d.]+)"/).map { |a, b| [Float(a), Float(b)] }
    assert_equal 16, circles.size
    assert(circles.none? { |cx, cy| cx.between?(box[0], box[2]) && cy.between?(box[1] - 3, box[3] + 3) }, "clear of the curve")
    assert_operator Float(x), :<, 100
  end

  def test_hline_label_stays_right_when_free
    points = (1..8).map { |t| [t, 10.0 * t] }
    svg = S.line_chart(title: "t", x_label: "x", y_label: "y", series: [{ name: "a", color: "#000", points: points }],
                       hlines: [{ y: 40.0, label: "ceiling", color: "#777" }])
    assert_match(/text-anchor="end" class="note"[^>]*>ceiling/, svg)
  end

  def test_legend_wraps_and_the_chart_grows
    long = Array.new(5) { |i| { name: "a rather long series name number #{i}", color: "#000", points: [[1, 1.0], [2, 2.0]] } }
    svg = S.line_chart(title: "t", x_label: "x", y_label: "y", series: long)
    rows = S.legend_rows(long.map { |s| [s[:name], s[:color]] })
    assert_operator rows.size, :>, 1
    rows.each { |row| assert_operator row.last[2] + 22 + S.text_width(row.last[0]) - 8, :<=, S::W - 4 + 1e-9 }
    assert_includes svg, %(height="#{S::H + 22 + (14 * (rows.size - 1))}")
  end

  def test_long_category_names_go_on_two_lines
    svg = S.bar_chart(title: "t", x_label: "x", y_label: "y",
                      categories: ["pool (measured) connections", "per process", "per machine", "fleet", "db max"],
                      series: [{ name: "c", color: "#000", values: [3, 3, 6, 12, 100] }])
    assert_match(/<tspan x="[\d.]+" dy="12">connections<\/tspan>/, svg)
  end
end
