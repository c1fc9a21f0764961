# frozen_string_literal: true

require "serval/advice/threads_text"
require "cgi"
require "serval/advice/svg"
require "serval/advice/table"
require "serval/advice/window"

module Serval
  module Advice
    # The HTML report `servalctl advise --html FILE` writes: one
    # self-contained page (inline CSS and SVG, no scripts, nothing fetched)
    # with the recommendation, charts of predicted and measured throughput
    # and latency against threads, the run / idle / stall / pool_wait / lock
    # distribution, the database connections, the sweep table, the reasons
    # and the warnings.
    #
    #   html = Serval::Advice::Report.new(advice, window: window_hash).html
    class Report
      COLORS = { predicted: "#1f6fb5", p50: "#6aa84f", p99: "#c0392b", measured: "#f1c232", ceiling: "#7f7f7f",
                 advised: "#8e44ad", knee: "#e67e22", run: "#c0392b", idle: "#1f6fb5", stall: "#e67e22",
                 pool_wait: "#8e44ad", lock: "#16a085" }.freeze
      # Bins (ms) of the distribution chart.
      BINS = [0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000].freeze
      FIGURES = %i[run idle stall pool_wait lock].freeze

      # advice: Recommender#call's Hash (Symbol or String keys); window: the
      # window it came from, for the distribution (optional).
      def initialize(advice, window: nil, title: "Serval concurrency advice")
        @a = Table.symbolize(advice)
        @window = window && Window.new(window)
        @title = title
      end

      def html
        <<~HTML
          <!DOCTYPE html>
          <html lang="en"><head><meta charset="utf-8"><title>#{esc(@title)}</title>
          <meta name="viewport" content="width=device-width, initial-scale=1">
          <style>#{CSS}</style></head>
          <body><h1>#{esc(@title)}</h1>
          #{headline}
          <div class="charts">#{charts.join("\n")}</div>
          #{routes_table}
          #{sweep_table}
          #{list('Why', @a[:reasons])}
          #{list('Warnings', @a[:warnings], 'warn')}
          <h2>As text (servalctl advise)</h2><pre>#{esc(Table.render(@a))}</pre>
          </body></html>
        HTML
      end

      CSS = <<~CSS.gsub(/\s+/, " ")
        body { font: 15px/1.45 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; max-width: 1180px; }
        h1 { font-size: 24px; margin: 0 0 12px; } h2 { font-size: 18px; margin: 24px 0 8px; }
        .big { font-size: 22px; font-weight: 600; } .box { border: 1px solid #ccc; border-radius: 6px; padding: 12px 16px; }
        .charts { display: flex; flex-wrap: wrap; gap: 16px; margin-top: 16px; }
        .charts svg { border: 1px solid #ddd; border-radius: 4px; background: #fff; }
        .title { font-size: 14px; font-weight: 600; } .tick, .note, .legend { font-size: 11px; } .axis { font-size: 12px; }
        .inbar { font-size: 12px; fill: #fff; font-weight: 600; }
        table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
        tr.advised { background: #efe3f5; font-weight: 600; } .warn li { color: #8a4b00; } pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
      CSS

      private

      def esc(text) = CGI.escapeHTML(text.to_s)
      def ms(seconds) = Table.ms(seconds)

      def headline
        unless @a[:enough_data]
          return %(<div class="box"><div class="big">No advice yet</div><p>#{esc(Array(@a[:warnings]).first)}</p></div>)
        end

        %(<div class="box"><div class="big">#{Advice.threads_text(@a)} x #{@a[:processes]} processes per machine</div>) +
          "<p>#{format('predicted max %.1f req/s per process, %.1f per machine', @a[:max_rps_per_process],
                       @a[:max_rps_per_machine].to_f)}; " \
          "#{format('cpu share %.2f', @a[:cpu_share])} from #{Table.grouped(@a[:requests])} requests" \
          "#{" (running #{@a[:running_threads]} threads)" if @a[:running_threads]}; " \
          "predicted stall at #{@a[:threads]} threads: mean #{ms(@a.dig(:stall, :mean))}, p95 #{ms(@a.dig(:stall, :p95))}</p></div>"
      end

      def charts
        out = []
        if @a[:enough_data] && @a[:sweep]
          out << throughput
          out << latency
        end
        out << mean_split if @a[:enough_data] && @a[:workload]
        out << distribution if @window&.samples&.any? || @window&.histograms&.any?
        out << route_split if @a[:enough_data] && @a[:routes]&.any?
        out << connections if @a[:enough_data] && @a[:database]
        out.compact
      end

      def sweep_points(key, scale = 1) = @a[:sweep].map { |r| [r[:threads], r[key] && r[key] * scale] }
      def x_max = @a[:sweep].size

      def marks
        v = [{ x: @a[:threads], label: "advised #{@a[:threads]}", color: COLORS[:advised] }]
        v << { x: @a[:knee], label: "knee #{@a[:knee]}", color: COLORS[:knee] } if @a[:knee] && @a[:knee] != @a[:threads]
        if @a.dig(:pool, :size) && @a.dig(:pool, :size) <= x_max && @a.dig(:pool, :size) != @a[:threads]
          v << { x: @a.dig(:pool, :size), label: "pool #{@a.dig(:pool, :size)}", color: COLORS[:ceiling] }
        end
        v
      end

      def throughput
        m = @a[:measured] || {}
        ceiling = @a.dig(:gvl_ceiling, :max_rps)
        Svg.line_chart(
          title: "Throughput against threads (one process)", x_label: "threads", y_label: "req/s", x_max: x_max,
          series: [{ name: "predicted max req/s", color: COLORS[:predicted], points: sweep_points(:rps) }],
          markers: [{ x: m[:threads], y: m[:loaded_rate] || m[:rate],
                      label: "measured: #{m[:loaded_rate] || m[:rate]} req/s served at #{m[:threads]} (loaded period)",
                      color: COLORS[:measured] }],
          vlines: marks,
          hlines: ceiling ? [{ y: ceiling, label: format("GVL ceiling 1 / run = %.0f req/s", ceiling), color: COLORS[:ceiling] }] : []
        )
      end

      def latency
        m = @a[:measured] || {}
        Svg.line_chart(
          title: "Latency against threads (saturated)", x_label: "threads", y_label: "ms", x_max: x_max,
          series: [{ name: "predicted p50", color: COLORS[:p50], points: sweep_points(:wall_p50, 1e3) },
                   { name: "predicted p99", color: COLORS[:p99], points: sweep_points(:wall_p99, 1e3) },
                   { name: "stall (mean)", color: COLORS[:stall], points: sweep_points(:stall_mean, 1e3), dash: true }],
          markers: [{ x: m[:threads], y: m[:wall_p99] && m[:wall_p99] * 1e3, label: "measured p99",
                      color: COLORS[:measured] }],
          vlines: marks
        )
      end

      # Where a request's time goes, on average.
      def mean_split
        w = @a[:workload]
        m = @a[:measured] || {}
        parts = [{ name: "run", value: w[:mean_run] * 1e3, color: COLORS[:run] },
                 { name: "I/O", value: w[:mean_io] * 1e3, color: COLORS[:idle] },
                 { name: "stall", value: (m[:stall_mean] || w[:estimated_stall]).to_f * 1e3, color: COLORS[:stall] },
                 { name: "pool_wait", value: m[:pool_wait_mean].to_f * 1e3, color: COLORS[:pool_wait] }]
        parts << { name: "lock", value: m[:lock_mean] * 1e3, color: COLORS[:lock] } if m[:lock_mean]
        Svg.stacked_bar(title: "A request's time, measured means (ms)", parts: parts, unit: "ms")
      end

      def distribution
        cats = [*BINS.map { |b| "\u2264#{Svg.label(b)}" }, ">#{Svg.label(BINS.last)}"]
        zero = []
        series = FIGURES.filter_map do |f|
          counts = binned(f) or next
          total = counts.sum
          next if total.zero?
          if counts.first == total # all below the first bin: nothing to draw
            zero << f
            next
          end

          { name: f.to_s, color: COLORS[f], values: counts.map { |c| 100.0 * c / total } }
        end
        return nil if series.empty?

        Svg.bar_chart(title: "Per request: #{series.map { |x| x[:name] }.join(' / ')} (#{@window.measured} measured)",
                      x_label: "ms (bin's upper bound)#{"; #{zero.join(', ')}: all under #{BINS.first} ms" if zero.any?}",
                      y_label: "% of requests", categories: cats, series: series)
      end

      # Counts per display bin, from samples, or from a histogram (each
      # bucket counted in the bin of its upper bound).
      def binned(figure)
        counts = Array.new(BINS.size + 1, 0)
        bin = ->(seconds) { BINS.index { |b| seconds * 1e3 <= b } || BINS.size }
        if @window.samples.any?
          vals = @window.samples.filter_map { |s| s[figure] }
          return nil if vals.empty?

          vals.each { |v| counts[bin.call(Float(v))] += 1 }
        else
          h = @window.histograms[figure] or return nil
          bounds = Array(h[:bounds]).map { |b| Float(b) }
          Array(h[:counts]).each_with_index { |c, i| counts[bin.call(bounds[i] || Float::INFINITY)] += Integer(c) }
        end
        counts
      end

      def connections
        d = @a[:database]
        cats = ["pool (measured)", "per process", "per machine", "fleet", "db max"]
        vals = [@a.dig(:pool, :size), d[:per_process], d[:per_machine], d[:fleet], d[:max_connections]]
        keep = vals.each_index.reject { |i| vals[i].nil? || (i == 3 && d[:machines] == 1 && d[:extra].zero?) }
        Svg.bar_chart(title: "Database connections#{' - the pool binds' if @a.dig(:pool, :binds)}",
                      x_label: d[:fits] == false ? "the fleet does not fit max_connections" : "advised",
                      y_label: "connections", categories: keep.map { |i| cats[i] },
                      series: [{ name: "connections", color: COLORS[:predicted], values: keep.map { |i| vals[i] } }])
      end

      ROUTE_COLORS = %w[#1f6fb5 #c0392b #6aa84f #e67e22 #8e44ad #16a085 #b7950b #7f8c8d #34495e].freeze

      # Where the process's time goes, route by route (Routes).
      def route_split
        parts = @a[:routes].each_with_index.map do |r, i|
          { name: r[:route], value: 100.0 * r[:share_time], color: ROUTE_COLORS[i % ROUTE_COLORS.size],
            text: "#{(100 * r[:share_time]).round} %" }
        end
        Svg.stacked_bar(title: "Time by route (run + I/O + stall, sampled requests)", parts: parts, unit: "%")
      end

      def routes_table
        rows = Array(@a[:routes])
        return "" unless @a[:enough_data] && rows.any?

        body = rows.map do |r|
          "<tr><td style=\"text-align:left\">#{esc(r[:route])}</td><td>#{r[:samples]}</td>" \
            "<td>#{(100 * r[:share_requests]).round(1)} %</td><td>#{(100 * r[:share_time]).round(1)} %</td>" \
            "<td>#{ms(r[:mean_run])}</td><td>#{ms(r[:mean_io])}</td><td>#{format('%.2f', r[:cpu_share])}</td>" \
            "<td>#{ms(r[:wall_p99])}</td><td>#{r[:alone] || '-'}</td></tr>"
        end
        "<h2>Routes, most time first</h2><table><tr><th style=\"text-align:left\">route</th><th>sampled</th>" \
          "<th>requests</th><th>time</th><th>run mean</th><th>I/O mean</th><th>cpu share</th><th>p99</th>" \
          "<th>threads alone</th></tr>#{body.join}</table><p class=\"note\">The advice plays the routes in this " \
          "mix; <em>threads alone</em> is the knee if the process served that route only.</p>"
      end

      def sweep_table
        return "" unless @a[:enough_data] && @a[:sweep]

        amdahl = Array(@a.dig(:amdahl, :table)).to_h { |r| [r[:threads], r[:speedup]] }
        rows = @a[:sweep].map do |r|
          cls = r[:threads] == @a[:threads] ? ' class="advised"' : ""
          "<tr#{cls}><td>#{r[:threads]}</td><td>#{format('%.1f', r[:rps])}</td><td>#{Table.gain(r[:gain])}</td>" \
            "<td>#{ms(r[:stall_mean])}</td><td>#{ms(r[:wall_p50])}</td><td>#{ms(r[:wall_p99])}</td>" \
            "<td>#{amdahl[r[:threads]] ? format('%.2f', amdahl[r[:threads]]) : '-'}</td></tr>"
        end
        "<h2>Predicted for one process, saturated</h2><table><tr><th>threads</th><th>req/s</th><th>gain</th>" \
          "<th>stall mean</th><th>p50</th><th>p99</th><th>Amdahl speedup</th></tr>#{rows.join}</table>"
      end

      def list(title, items, cls = "")
        items = Array(items)
        return "" if items.empty?

        %(<h2>#{esc(title)}</h2><ul class="#{cls}">#{items.map { |i| "<li>#{esc(i)}</li>" }.join}</ul>)
      end
    end
  end
end
