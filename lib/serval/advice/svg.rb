# frozen_string_literal: true

require "cgi"

module Serval
  module Advice
    # Small inline SVG charts for the HTML report: no scripts, no fonts or
    # files from elsewhere, so the page opens offline. Every method returns
    # one <svg> element as a String.
    module Svg
      W = 540
      H = 300
      PAD = { left: 64, right: 16, top: 30, bottom: 48 }.freeze

      module_function

      def esc(text) = CGI.escapeHTML(text.to_s)

      # A "nice" axis maximum and tick step for values up to max.
      def ticks(max)
        max = 1.0 unless max.positive?
        raw = max / 5.0
        mag = 10**Math.log10(raw).floor
        step = [1, 2, 2.5, 5, 10].map { |m| m * mag }.find { |s| s >= raw }
        top = (max / step).ceil * step
        [top, step]
      end

      def label(v)
        v >= 100 || v == v.round ? v.round.to_s : format("%.3g", v)
      end

      # series: [{name:, color:, points: [[x, y], ...], dash: bool}]
      # markers: [{x:, y:, label:, color:}]  vlines: [{x:, label:, color:}]
      # hlines: [{y:, label:, color:}]
      def line_chart(title:, x_label:, y_label:, series:, markers: [], vlines: [], hlines: [], x_max: nil)
        xs = series.flat_map { |s| s[:points].map(&:first) } + markers.map { |m| m[:x] }
        ys = series.flat_map { |s| s[:points].map(&:last) } + markers.map { |m| m[:y] } + hlines.map { |h| h[:y] }
        x_top = x_max || xs.compact.max || 1
        y_top, y_step = ticks((ys.compact.max || 1) * 1.05)
        px = ->(x) { PAD[:left] + ((W - PAD[:left] - PAD[:right]) * (x - 1).to_f / [x_top - 1, 1].max) }
        py = ->(y) { H - PAD[:bottom] - ((H - PAD[:top] - PAD[:bottom]) * y.to_f / y_top) }
        items = series.map { |s| [s[:name], s[:color]] } + markers.select { |m| m[:x] && m[:y] }.map { |m| [m[:label], m[:color]] }
        out = frame(title, x_label, y_label, legend_lines: legend_rows(items).size)
        out << y_grid(y_top, y_step, py)
        x_step = x_top > 10 ? 2 : 1
        (1..x_top).step(x_step) do |x|
          out << %(<text x="#{px.call(x).round(1)}" y="#{H - PAD[:bottom] + 16}" text-anchor="middle" class="tick">#{x}</text>)
        end
        vlines.each_with_index do |v, i|
          x = px.call(v[:x]).round(1)
          out << %(<line x1="#{x}" y1="#{PAD[:top]}" x2="#{x}" y2="#{H - PAD[:bottom]}" stroke="#{v[:color]}" ) +
                 %(stroke-width="1.5" stroke-dasharray="4 3"/><text x="#{x + 3}" y="#{PAD[:top] + 12 + (14 * i)}" ) +
                 %(class="note" fill="#{v[:color]}">#{esc(v[:label])}</text>)
        end
        drawn = series.flat_map { |s| s[:points].reject { |_, y| y.nil? }.map { |x, y| [px.call(x), py.call(y)] } }
        taken = vlines.each_with_index.map { |v, i| box(px.call(v[:x]) + 3, PAD[:top] + 12 + (14 * i), v[:label]) }
        hlines.each do |h|
          y = py.call(h[:y]).round(1)
          out << %(<line x1="#{PAD[:left]}" y1="#{y}" x2="#{W - PAD[:right]}" y2="#{y}" stroke="#{h[:color]}" ) +
                 %(stroke-dasharray="2 3"/>)
          lx, ly, anchor = hline_label_at(y, h[:label], drawn, taken)
          taken << box(anchor == "end" ? lx - text_width(h[:label]) : lx, ly, h[:label])
          out << %(<text x="#{lx}" y="#{ly}" text-anchor="#{anchor}" class="note" fill="#{h[:color]}">#{esc(h[:label])}</text>)
        end
        series.each do |s|
          pts = s[:points].reject { |_, y| y.nil? }.map { |x, y| "#{px.call(x).round(1)},#{py.call(y).round(1)}" }
          next if pts.empty?

          dash = s[:dash] ? ' stroke-dasharray="6 4"' : ""
          out << %(<polyline points="#{pts.join(' ')}" fill="none" stroke="#{s[:color]}" stroke-width="2.5"#{dash}/>)
          pts.each { |p| out << %(<circle cx="#{p.split(',')[0]}" cy="#{p.split(',')[1]}" r="2.5" fill="#{s[:color]}"/>) }
        end
        markers.each do |m|
          next unless m[:x] && m[:y]

          cx = px.call(m[:x]).round(1)
          cy = py.call(m[:y]).round(1)
          out << %(<rect x="#{cx - 6}" y="#{cy - 6}" width="12" height="12" fill="#{m[:color]}" stroke="#222"/>)
        end
        out << legend(items)
        out << "</svg>"
      end

      # Grouped bars: categories along x, one bar per series in each.
      def bar_chart(title:, x_label:, y_label:, categories:, series:)
        y_top, y_step = ticks((series.flat_map { |s| s[:values] }.max || 1) * 1.05)
        py = ->(y) { H - PAD[:bottom] - ((H - PAD[:top] - PAD[:bottom]) * y.to_f / y_top) }
        items = series.map { |s| [s[:name], s[:color]] }
        out = frame(title, x_label, y_label, legend_lines: legend_rows(items).size)
        out << y_grid(y_top, y_step, py)
        slot = (W - PAD[:left] - PAD[:right]).to_f / categories.size
        bar = (slot - 6) / [series.size, 1].max
        categories.each_with_index do |c, i|
          x0 = PAD[:left] + (slot * i) + 3
          out << category_label(c, (x0 + (slot / 2) - 3).round(1), H - PAD[:bottom] + 16, slot - 4)
          series.each_with_index do |s, j|
            v = s[:values][i].to_f
            next unless v.positive?

            y = py.call(v)
            out << %(<rect x="#{(x0 + (bar * j)).round(1)}" y="#{y.round(1)}" width="#{(bar - 1).round(1)}" ) +
                   %(height="#{(H - PAD[:bottom] - y).round(1)}" fill="#{s[:color]}"><title>#{esc(s[:name])} #{esc(c)}: ) +
                   %(#{label(v)}</title></rect>)
          end
        end
        out << legend(items)
        out << "</svg>"
      end

      # One horizontal bar split in parts: [{name:, value:, color:}].
      def stacked_bar(title:, parts:, unit:)
        total = parts.sum { |p| p[:value].to_f }
        items = parts.map { |p| ["#{p[:name]} #{p[:text] || "#{label(p[:value].to_f)} #{unit}"}", p[:color]] }
        h = 110 + (14 * (legend_rows(items).size - 1))
        out = +%(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 #{W} #{h}" width="#{W}" height="#{h}" role="img">)
        out << %(<title>#{esc(title)}</title><text x="#{W / 2}" y="18" text-anchor="middle" class="title">#{esc(title)}</text>)
        x = PAD[:left].to_f
        width = W - PAD[:left] - PAD[:right]
        parts.each do |p|
          v = p[:value].to_f
          next unless total.positive? && v.positive?

          w = width * v / total
          out << %(<rect x="#{x.round(1)}" y="32" width="#{w.round(1)}" height="34" fill="#{p[:color]}"><title>) +
                 %(#{esc(p[:name])}: #{label(v)} #{unit}</title></rect>)
          out << %(<text x="#{(x + (w / 2)).round(1)}" y="54" text-anchor="middle" class="inbar">#{(100 * v / total).round} %</text>) if w > 34
          x += w
        end
        out << legend(items, y: 88)
        out << "</svg>"
      end

      # Label geometry, for placing labels clear of each other and of the
      # lines (11 px text: about 6.2 px a character).
      CHAR = 6.2
      def text_width(text) = text.to_s.size * CHAR

      # [x0, y0, x1, y1] of a label whose baseline starts at x, y.
      def box(x, y, text) = [x, y - 10, x + text_width(text), y + 2]

      def overlaps?(a, b) = a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]

      # Where an horizontal line's label goes: right or left end, above or
      # below the line, the first spot clear of the drawn points (and the
      # segments between them) and of the labels already placed.
      def hline_label_at(y, text, points, taken)
        w = text_width(text)
        spots = [[W - PAD[:right] - 4, y - 4, "end"], [W - PAD[:right] - 4, y + 13, "end"],
                 [PAD[:left] + 4, y + 13, "start"], [PAD[:left] + 4, y - 4, "start"]]
        segs = points.each_cons(2).flat_map { |(x0, y0), (x1, y1)| (0..4).map { |k| [x0 + ((x1 - x0) * k / 4.0), y0 + ((y1 - y0) * k / 4.0)] } }
        dots = points + segs
        spots.min_by do |x, yy, anchor|
          b = box(anchor == "end" ? x - w : x, yy, text)
          b = [b[0] - 3, b[1] - 3, b[2] + 3, b[3] + 3]
          hits = dots.count { |px, py| px.between?(b[0], b[2]) && py.between?(b[1], b[3]) }
          hits + (100 * taken.count { |t| overlaps?(t, b) })
        end
      end

      # A category under its bars, on two lines (split at the space nearest
      # its middle) when one is wider than its slot.
      def category_label(text, x, y, room)
        text = text.to_s
        cut = text.size / 2
        at = text.each_char.with_index.select { |ch, _| ch == " " }.map(&:last).min_by { |i| (i - cut).abs }
        if text_width(text) <= room || at.nil?
          return %(<text x="#{x}" y="#{y}" text-anchor="middle" class="tick">#{esc(text)}</text>)
        end

        %(<text x="#{x}" y="#{y}" text-anchor="middle" class="tick"><tspan x="#{x}">#{esc(text[0...at])}</tspan>) +
          %(<tspan x="#{x}" dy="12">#{esc(text[(at + 1)..])}</tspan></text>)
      end

      # Legend rows: items wrapped to the chart's width.
      def legend_rows(items)
        rows = [[]]
        x = PAD[:left]
        items.each do |name, color|
          step = 22 + text_width(name)
          if x + step - 8 > W - 4 && rows.last.any?
            rows << []
            x = PAD[:left]
          end
          rows.last << [name, color, x]
          x += step
        end
        rows
      end

      def frame(title, x_label, y_label, legend_lines: 1)
        h = H + 22 + (14 * (legend_lines - 1))
        out = +%(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 #{W} #{h}" width="#{W}" height="#{h}" role="img">)
        out << %(<title>#{esc(title)}</title><text x="#{W / 2}" y="18" text-anchor="middle" class="title">#{esc(title)}</text>)
        out << %(<line x1="#{PAD[:left]}" y1="#{H - PAD[:bottom]}" x2="#{W - PAD[:right]}" y2="#{H - PAD[:bottom]}" stroke="#444"/>)
        out << %(<line x1="#{PAD[:left]}" y1="#{PAD[:top]}" x2="#{PAD[:left]}" y2="#{H - PAD[:bottom]}" stroke="#444"/>)
        out << %(<text x="#{(W + PAD[:left]) / 2}" y="#{H - 14}" text-anchor="middle" class="axis">#{esc(x_label)}</text>)
        out << %(<text x="14" y="#{H / 2}" text-anchor="middle" class="axis" transform="rotate(-90 14 #{H / 2})">#{esc(y_label)}</text>)
      end

      def y_grid(top, step, py)
        out = +""
        v = 0.0
        while v <= top + (step / 1000)
          y = py.call(v).round(1)
          out << %(<line x1="#{PAD[:left]}" y1="#{y}" x2="#{W - PAD[:right]}" y2="#{y}" stroke="#e4e4e4"/>)
          out << %(<text x="#{PAD[:left] - 6}" y="#{y + 4}" text-anchor="end" class="tick">#{label(v)}</text>)
          v += step
        end
        out
      end

      def legend(items, y: H + 12)
        legend_rows(items).each_with_index.flat_map do |row, r|
          yy = y + (14 * r)
          row.map do |name, color, x|
            %(<rect x="#{x.round(1)}" y="#{yy - 9}" width="10" height="10" fill="#{color}"/>) +
              %(<text x="#{(x + 14).round(1)}" y="#{yy}" class="legend">#{esc(name)}</text>)
          end
        end.join
      end
    end
  end
end
