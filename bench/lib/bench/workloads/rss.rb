# frozen_string_literal: true

module Bench
  module Workloads
    # Resident memory after boot with the hello app and one request, summed
    # over the server's whole process tree.
    class Rss < Workload
      register "rss"

      def name = "rss"
      def description = "VmRSS of the process tree after boot (hello app) and one request"

      def run(servers)
        rounds = Hash.new { |h, k| h[k] = [] }
        meta = {}
        ctx.rounds.times do |round|
          order(servers, round).each do |server|
            with_server(server, "hello.ru") do |process|
              HTTP.get("127.0.0.1", process.port, "/", timeout: 5)
              sleep 0.5
              tree = Util.process_tree(process.pid)
              rounds[server.name] << { "kb" => process.rss_kb, "processes" => tree.size }
              meta[server.name] ||= { "version" => server.version, "server_command" => process.command.join(" ") }
            end
            ctx.log "rss: round #{round + 1} #{server.name} #{rounds[server.name].last['kb']} kB"
          end
        end
        results = {}
        rounds.each do |sname, list|
          best = list.min_by { |r| r["kb"] }
          results[sname] = meta[sname].merge("rss_mb" => (best["kb"] / 1024.0).round(1),
                                             "processes" => best["processes"], "rounds_kb" => list.map { |r| r["kb"] })
        end
        r = ratio(results, "rss_mb")
        {
          "name" => name, "description" => description, "servers" => results, "ratio" => r,
          "pick" => "lowest of #{ctx.rounds} rounds",
          "check" => { "target" => "serval/puma RSS <= 1.0", "ok" => r && r <= 1.0 }
        }
      end

      def table(result)
        rows = [["server", "version", "processes", "RSS", "vs serval", "rounds(kB)"]]
        result["servers"].each do |sname, s|
          rows << [sname, s["version"], s["processes"].to_s, format("%.1f MB", s["rss_mb"]),
                   vs_serval(result["servers"], sname, "rss_mb"), s["rounds_kb"].join(", ")]
        end
        [rows, ["figures: #{result['pick']}", "serval/puma RSS: #{result['ratio'] || 'n/a'} (issue target <= 1.0)"]]
      end
    end
  end
end
