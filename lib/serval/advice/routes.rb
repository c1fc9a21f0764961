# frozen_string_literal: true

require "serval/advice/quantile"

module Serval
  module Advice
    # Mixed traffic, route by route: the window's samples grouped by their
    # `route` key (Timing.route_key) into what each route asks of a process
    # and what share of the process's time it takes. The model itself plays
    # the samples as they came (Workload's pairs: each request its own run
    # and io, in the window's mix), so a 2 ms read and a 300 ms query are
    # never averaged into one 40 ms request; this is the explanation beside
    # it: which routes hold the GVL, which wait, and how the answer would
    # move if the mix shifted towards one of them (`alone`: the knee if the
    # process served that route only, for the top routes).
    #
    # Rows sorted by time (run + idle + stall, summed), the top TOP and then
    # "other" for the rest; samples without a route are "(unknown)".
    module Routes
      TOP = 8
      OTHER = "other"
      UNKNOWN = "(unknown)"
      MIN_ALONE = 30 # samples a route needs for its own knee
      ALONE_TOP = 3  # routes given their own knee (a sweep each)

      module_function

      # samples: the window's sample Hashes (Symbol keys). `knee`: a block
      # giving the knee for a list of [run, io] pairs, or nil.
      def call(samples, top: TOP, &knee)
        keyed = samples.group_by { |s| (s[:route] || UNKNOWN).to_s }
        return nil if keyed.size < 2 && keyed.key?(UNKNOWN)

        rows = keyed.map { |route, list| row(route, list) }
        total = rows.sum { |r| r[:seconds] }
        rows.sort_by! { |r| [-r[:seconds], r[:route]] }
        if rows.size > top
          rest = rows.drop(top)
          rows = rows.first(top) << row(OTHER, rest.flat_map { |r| keyed[r[:route]] })
        end
        n = samples.size
        rows.each do |r|
          r[:share_requests] = (r[:samples].to_f / n).round(4)
          r[:share_time] = total.positive? ? (r[:seconds] / total).round(4) : 0.0
          list = r[:route] == OTHER ? nil : keyed[r[:route]]
          r[:alone] = knee.call(list.map { |s| [s[:run].to_f, s[:idle].to_f] }) if knee && list && list.size >= MIN_ALONE && rows.index(r) < ALONE_TOP
          r[:seconds] = r[:seconds].round(6)
        end
        rows
      end

      def row(route, list)
        runs = list.map { |s| (s[:run] || s[:cpu]).to_f }
        ios = list.map { |s| s[:idle] ? s[:idle].to_f : [s[:wall].to_f - (s[:cpu] || s[:run]).to_f, 0.0].max }
        walls = list.filter_map { |s| s[:wall]&.to_f }.sort
        run = runs.sum / list.size
        io = ios.sum / list.size
        { route: route, samples: list.size, mean_run: run.round(6), mean_io: io.round(6),
          cpu_share: (run + io).positive? ? (run / (run + io)).round(4) : 1.0,
          wall_p99: walls.empty? ? nil : Advice.quantile(walls, 0.99).round(6),
          seconds: list.sum { |s| (s[:run] || s[:cpu]).to_f + (s[:idle] || 0).to_f + s[:stall].to_f } }
      end
    end
  end
end
