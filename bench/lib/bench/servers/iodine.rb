# frozen_string_literal: true

module Bench
  module Servers
    # Iodine from bench/Gemfile (a Rack server with its own C event loop,
    # facil.io): the same Rack app with `-t THREADS -w WORKERS`. It runs only
    # where asked for: in the workloads that name it (connections) or with
    # --servers=...,iodine.
    class Iodine < Server
      register "iodine"

      def name = "iodine"
      def opt_in? = true

      def version
        gem_version("iodine") || "unknown"
      end

      def unavailable_reason
        gem_version("iodine") ? nil : "gem iodine not in the installed bundle (bench/Gemfile)"
      end

      def layout(threads:, workers: 1)
        "#{workers} x #{threads} threads (-w #{workers})"
      end

      def argv(app:, port:, threads:, workers: 1, max_connections: nil)
        ["bundle", "exec", "iodine", "-b", "127.0.0.1", "-p", port.to_s,
         "-t", threads.to_s, "-w", workers.to_s, app]
      end
    end
  end
end
