# frozen_string_literal: true

module Bench
  module Servers
    # Serval from this checkout (lib/ and exe/serval), under bench's bundle so
    # that it sees the same rack as Puma and pays the same bundler overhead.
    # SERVAL_EXE points the adapter at another executable taking the same flags.
    class Serval < Server
      register "serval"

      def name
        "serval"
      end

      def exe
        ENV.fetch("SERVAL_EXE", File.join(ctx.root, "exe", "serval"))
      end

      def version
        @version ||= begin
          file = File.join(ctx.root, "lib", "serval", "version.rb")
          v = File.exist?(file) ? File.read(file)[/VERSION\s*=\s*"([^"]+)"/, 1] : nil
          rev = ctx.git_rev
          [v || "unknown", rev && "(#{rev})"].compact.join(" ")
        end
      end

      # Cluster mode exists once `serval --help` no longer lists -w among the
      # options "accepted from Puma, not supported yet".
      def cluster?
        return @cluster if defined?(@cluster)

        _status, out, = Util.capture(["ruby", "-I", File.join(ctx.root, "lib"), exe, "--help"], chdir: ctx.root, timeout: 30)
        unsupported = out.split(/^.*not supported yet.*$/, 2)[1].to_s
        @cluster = out.include?("--workers") && !unsupported.include?("--workers")
      end

      def effective_workers(workers)
        workers > 1 && !cluster? ? 1 : workers
      end

      def layout(threads:, workers: 1)
        w = effective_workers(workers)
        note = w == workers ? "" : " (no cluster mode yet)"
        "#{w} x #{threads} threads#{note}"
      end

      # max_connections: --max-connections (the default, 1024, evicts idle
      # keep-alive connections beyond it).
      def argv(app:, port:, threads:, workers: 1, max_connections: nil)
        w = effective_workers(workers)
        ["bundle", "exec", "ruby", "-I", File.join(ctx.root, "lib"), exe,
         "-q", "-e", "production", "-b", "tcp://127.0.0.1:#{port}", "-t", "#{threads}:#{threads}",
         *(w > 1 ? ["-w", w.to_s] : []), *(max_connections ? ["--max-connections", max_connections.to_s] : []), app]
      end
    end
  end
end
