# frozen_string_literal: true

module Bench
  module Servers
    # Falcon (falcon serve, forked model): one process per budgeted process,
    # each running every request in its own fiber on an event loop, so the
    # thread count has no equivalent (its concurrency per process is not
    # capped). `sleep` and socket I/O in the app yield to other fibers; CPU
    # work blocks the whole process.
    class Falcon < Server
      register "falcon"

      def name
        "falcon"
      end

      def version
        gem_version("falcon") || "unknown"
      end

      def unavailable_reason
        gem_version("falcon") ? nil : "gem falcon not in the installed bundle"
      end

      def layout(threads:, workers: 1)
        "#{workers} x fibers (no thread cap)"
      end

      def argv(app:, port:, threads:, workers: 1, **)
        ["bundle", "exec", "falcon", "serve", "--forked", "-n", workers.to_s,
         "-b", "http://127.0.0.1:#{port}", "-c", app]
      end
    end
  end
end
