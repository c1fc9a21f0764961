# frozen_string_literal: true

module Bench
  module Servers
    # Puma from bench/Gemfile, min = max threads; single mode (-w 0) for one
    # process, cluster mode (-w N) otherwise.
    class Puma < Server
      register "puma"

      def name
        "puma"
      end

      def version
        @version ||= begin
          _status, out, = Util.capture(%w[bundle exec puma --version], env: env, chdir: chdir, timeout: 60)
          out[/puma version (\S+)/, 1] || "unknown"
        end
      end

      def argv(app:, port:, threads:, workers: 1, **)
        ["bundle", "exec", "puma", "-q", "-e", "production", "-w", (workers > 1 ? workers : 0).to_s,
         "-b", "tcp://127.0.0.1:#{port}", "-t", "#{threads}:#{threads}", app]
      end
    end
  end
end
