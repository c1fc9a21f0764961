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

      def argv(app:, port:, threads:)
        ["bundle", "exec", "ruby", "-I", File.join(ctx.root, "lib"), exe,
         "-q", "-e", "production", "-b", "tcp://127.0.0.1:#{port}", "-t", "#{threads}:#{threads}", app]
      end
    end
  end
end
