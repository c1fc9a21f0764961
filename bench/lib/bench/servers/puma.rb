# frozen_string_literal: true

module Bench
  module Servers
    # Puma from bench/Gemfile, single mode (no workers), min = max threads.
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

      def argv(app:, port:, threads:)
        ["bundle", "exec", "puma", "-q", "-e", "production", "-w", "0", "-b", "tcp://127.0.0.1:#{port}", "-t", "#{threads}:#{threads}", app]
      end
    end
  end
end
