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
        out = frame(title, x_label, y_label)
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
        hlines.each do |h|
          y = py.call(h[:y]).round(1)
          out << %(<line x1="#{PAD[:left]}" y1="#{y}" x2="#{W - PAD[:right]}" y2="#{y}" stroke="#{h[:color]}" ) +
                 %(stroke-dasharray="2 3"/><text x="#{W - PAD[:right] - 4}" y="#{y - 4}" text-anchor="end" ) +
                 %(class="note" fill="#{h[:color]}">#{esc(h[:label])}</text>)
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
        out << legend(series.map { |s| [s[:name], s[:color]] } + markers.select { |m| m[:x] && m[:y] }.map { |m| [m[:label], m[:color]] })
        out << "</svg>"
      end

      # Grouped bars: categories along x, one bar per series in each.
      def bar_chart(title:, x_label:, y_label:, categories:, series:)
        y_top, y_step = ticks((series.flat_map { |s| s[:values] }.max || 1) * 1.05)
        py = ->(y) { H - PAD[:bottom] - ((H - PAD[:top] - PAD[:bottom]) * y.to_f / y_top) }
        out = frame(title, x_label, y_label)
        out << y_grid(y_top, y_step, py)
        slot = (W - PAD[:left] - PAD[:right]).to_f / categories.size
        bar = (slot - 6) / [series.size, 1].max
        categories.each_with_index do |c, i|
          x0 = PAD[:left] + (slot * i) + 3
          out << %(<text x="#{(x0 + (slot / 2) - 3).round(1)}" y="#{H - PAD[:bottom] + 16}" text-anchor="middle" class="tick">#{esc(c)}</text>)
          series.each_with_index do |s, j|
            v = s[:values][i].to_f
            next unless v.positive?

            y = py.call(v)
            out << %(<rect x="#{(x0 + (bar * j)).round(1)}" y="#{y.round(1)}" width="#{(bar - 1).round(1)}" ) +
                   %(height="#{(H - PAD[:bottom] - y).round(1)}" fill="#{s[:color]}"><title>#{esc(s[:name])} #{esc(c)}: ) +
                   %(#{label(v)}</title></rect>)
          end
        end
        out << legend(series.map { |s| [s[:name], s[:color]] })
        out << "</svg>"
      end

      # One horizontal bar split in parts: [{name:, value:, color:}].
      def stacked_bar(title:, parts:, unit:)
        total = parts.sum { |p| p[:value].to_f }
        h = 110
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
        out << legend(parts.map { |p| ["#{p[:name]} #{label(p[:value].to_f)} #{unit}", p[:color]] }, y: 88)
        out << "</svg>"
      end

      def frame(title, x_label, y_label)
        out = +%(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 #{W} #{H + 22}" width="#{W}" height="#{H + 22}" role="img">)
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
        x = PAD[:left]
        items.map do |name, color|
          s = %(<rect x="#{x}" y="#{y - 9}" width="10" height="10" fill="#{color}"/><text x="#{x + 14}" y="#{y}" class="legend">#{esc(name)}</text>)
          x += 22 + (name.to_s.size * 6.2)
          s
        end.join
      end
    end
  end
end
