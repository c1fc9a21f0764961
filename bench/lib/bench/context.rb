# frozen_string_literal: true

require "tmpdir"
require "fileutils"

module Bench
  # Settings of one run (from the environment) and the paths everything uses.
  class Context
    attr_reader :root, :bench_dir, :duration, :warmup, :rounds, :threads, :connections,
                :boot_timeout, :server_cpu, :client_cpu, :scratch

    def initialize(bench_dir, io: $stderr)
      @bench_dir = File.expand_path(bench_dir)
      @root = File.dirname(@bench_dir)
      @io = io
      @duration = Integer(ENV.fetch("BENCH_DURATION", "5"))
      @warmup = Integer(ENV.fetch("BENCH_WARMUP", "2"))
      @rounds = Integer(ENV.fetch("BENCH_ROUNDS", "1"))
      @threads = Integer(ENV.fetch("BENCH_THREADS", "4"))
      @connections = Integer(ENV.fetch("BENCH_CONNECTIONS", "16"))
      @boot_timeout = Float(ENV.fetch("BENCH_BOOT_TIMEOUT", "30"))
      @server_cpu = ENV.fetch("BENCH_SERVER_CPU", "0")
      @client_cpu = ENV.fetch("BENCH_CLIENT_CPU", "1")
      @pin = ENV.fetch("BENCH_PIN", "1") != "0" && Util.which("taskset") && Util.nproc >= 2
      @scratch = Dir.mktmpdir("serval-bench-")
    end

    def pin? = @pin

    def pin_server(argv, cpus: nil) = pin? ? ["taskset", "-c", cpus || server_cpu, *argv] : argv

    # All online CPUs as a taskset list ("0-1"), for the "all cores" runs.
    def all_cpus = "0-#{Util.nproc - 1}"

    def pin_client(argv) = pin? ? ["taskset", "-c", client_cpu, *argv] : argv

    def gemfile = File.join(bench_dir, "Gemfile")

    # Environment for anything run through bench's bundle. A RUBYOPT that
    # loads another bundle (bench/run started under `bundle exec`) is dropped.
    def bundle_env
      rubyopt = ENV["RUBYOPT"].to_s.split.reject { |o| o.include?("bundler/setup") }.join(" ")
      { "BUNDLE_GEMFILE" => gemfile, "RUBYOPT" => rubyopt.empty? ? nil : rubyopt }
    end

    def git_rev
      return @git_rev if defined?(@git_rev)

      status, out, = Util.capture(%w[git rev-parse --short HEAD], chdir: root, timeout: 10)
      @git_rev = status&.success? ? out.strip : nil
      if @git_rev
        _, dirty, = Util.capture(%w[git status --porcelain --untracked-files=no -- lib exe ext], chdir: root, timeout: 10)
        @git_rev += "+dirty" unless dirty.strip.empty?
      end
      @git_rev
    end

    def log(msg)
      @io.puts(msg)
      @io.flush
    end

    def cleanup
      FileUtils.rm_rf(@scratch) if @scratch && !ENV["BENCH_KEEP_LOGS"]
    end
  end
end
