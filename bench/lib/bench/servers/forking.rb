# frozen_string_literal: true

module Bench
  module Servers
    # Shared by Unicorn and Pitchfork: single-threaded worker processes. The
    # budget "P processes x T threads" becomes P x T workers, so that every
    # server has the same number of requests in the app at once (the article's
    # "Puma 100 threads vs Unicorn 100 workers"); all of them are pinned to the
    # same CPUs as the threaded servers.
    class Forking < Server
      def version
        gem_version(name) || "unknown"
      end

      def unavailable_reason
        gem_version(name) ? nil : "gem #{name} not in bench/Gemfile.lock's installed bundle"
      end

      def worker_count(threads:, workers:)
        [threads * workers, 1].max
      end

      def layout(threads:, workers: 1)
        "#{worker_count(threads: threads, workers: workers)} workers x 1 thread"
      end

      def config(port:, workers:)
        <<~RUBY
          worker_processes #{workers}
          listen "127.0.0.1:#{port}", backlog: 1024
          timeout 120
        RUBY
      end

      def argv(app:, port:, threads:, workers: 1, **)
        path = File.join(ctx.scratch, "#{name}-#{port}.conf.rb")
        File.write(path, config(port: port, workers: worker_count(threads: threads, workers: workers)))
        ["bundle", "exec", name, "-E", "production", "-c", path, app]
      end
    end

    class Unicorn < Forking
      register "unicorn"

      def name
        "unicorn"
      end

      def config(port:, workers:)
        super + "preload_app true\n"
      end
    end

    class Pitchfork < Forking
      register "pitchfork"

      def name
        "pitchfork"
      end
    end
  end
end
