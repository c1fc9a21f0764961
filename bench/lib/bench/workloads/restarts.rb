# frozen_string_literal: true

require_relative "../../../../test/support/http_wire"

module Bench
  module Workloads
    # Zero dropped requests: Serval with 2 workers (3 for TTOU) under a
    # continuous load of 4 client threads (keep-alive connections of 1..5
    # requests, then a new connection), one event per scenario: USR2 (hot
    # restart), USR1 (phased restart), TTOU, TERM (graceful stop). At least
    # `requests` answered requests per scenario; counting rules are those of
    # test/support/http_wire.rb, HttpWire::LoadClient (bench/NOTES.md "Zero dropped requests").
    class Restarts < Workload
      register "restarts"

      SCENARIOS = { "hot restart (USR2)" => ["USR2", 2], "phased restart (USR1)" => ["USR1", 2],
                    "remove a worker (TTOU)" => ["TTOU", 3], "graceful stop (TERM)" => ["TERM", 2] }.freeze

      def name = "restarts"
      def requests = Integer(ENV.fetch("BENCH_RESTART_REQUESTS", "10000"))

      def description
        "Serval -w 2 (3 for TTOU) -t 2:2, 4 client threads (keep-alive 1..5 requests per connection); " \
          "the signal is sent after #{requests / 2} answered requests (TERM: #{requests}), the run ends after #{requests} or more"
      end

      def run(servers)
        server = servers.find { |s| s.name == "serval" }
        raise Error, "restarts: needs the serval server" unless server

        results = {}
        SCENARIOS.each do |label, (signal, workers)|
          ctx.log "#{name}: #{label}"
          results[label] = scenario(server, signal, workers)
          r = results[label]
          ctx.log "  ok #{r['ok']}, failed #{r['failed']}, retried #{r['retried']}, refused #{r['refused']}"
        end
        { "name" => name, "description" => description, "servers" => { "serval" => { "version" => server.version } },
          "scenarios" => results,
          "check" => { "target" => "0 failed, >= #{requests} ok per scenario",
                       "ok" => results.values.all? { |r| r["failed"].zero? && r["ok"] >= requests } } }
      end

      def scenario(server, signal, workers)
        process = server.start(app: app_path("hello.ru"), port: Util.free_port, threads: 2, workers: workers,
                               cpus: ctx.all_cpus)
        process.wait_ready
        sleep 1
        load = ::Serval::HttpWire::LoadClient.new(process.port, threads: 4).start
        load.wait_for_more(signal == "TERM" ? requests : requests / 2, timeout: 120)
        load.refuse_from_now if signal == "TERM"
        Process.kill(signal, process.pid)
        if signal == "TERM"
          sleep 0.05 while process.alive?
        else
          load.wait_for_more(requests - load.ok_count, timeout: 120) if load.ok_count < requests
          load.wait_for_more(requests / 10, timeout: 60) # and more after the event settled
        end
        r = load.stop
        { "ok" => r.ok, "failed" => r.failed, "retried" => r.retried, "refused" => r.refused,
          "errors" => r.errors, "server_command" => process.command.join(" ") }
      ensure
        process&.stop
      end

      def table(result)
        rows = [%w[scenario ok failed retried refused]]
        result["scenarios"].each do |label, r|
          rows << [label, r["ok"].to_s, r["failed"].to_s, r["retried"].to_s, r["refused"].to_s]
        end
        [rows, ["retried: reused keep-alive connection closed before any answer byte, sent again once (counted by its retry)",
                "refused: graceful stop only, connect refused/reset after the stop began"]]
      end
    end
  end
end
