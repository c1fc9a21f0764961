# frozen_string_literal: true

require "securerandom"

module Bench
  # The workloads `bench/run advice` checks the advice on. Each says which app
  # a server runs, how closed-loop (wrk) and open-loop (open_loop.rb) load
  # asks for it, and how to start a server on it with a thread count (or
  # "auto") and extra flags:
  #
  #   Synthetic  bench/apps/advice.ru at one CPU share (the issue-9 workloads)
  #   Mixed      bench/apps/advice_mixed.ru: fast database-like reads, view-
  #              rendering-like CPU and slow queries, 60 / 30 / 10 %, on the
  #              same stand-in database
  #   Rails      examples/rails in production (its production logger on: Rails'
  #              request lines to the server's stdout, a file) on PostgreSQL:
  #              a 10-row read, the posts index view, a slow query (pg_sleep)
  module AdviceCases
    # What every case shares: tagging (tagged.lua / open_loop --tag, see
    # Advice::SWEEP_TAG_BASE) and the default sweep of 1..max threads.
    class Base
      attr_reader :workload

      def initialize(workload)
        @workload = workload
      end

      def ctx = workload.ctx
      def tagged? = workload.tagged?
      def ready_path = "/"
      def boot_timeout = ctx.boot_timeout
      # seconds of closed-loop load before a sweep point's measurement
      def sweep_warmup = workload.warmup
      # s of load before the advice is asked (BENCH_ADVICE_WINDOW_WARMUP, 70):
      # the server's window is its last 60 s (six 10 s buckets), so only after
      # 70 s does it hold no request of the server's first 10 s. A window of
      # the first seconds read 10 % CPU at 8 threads 7 % slower than the
      # sweep's warm servers did (bench/NOTES.md "Session 34"); 10 s of load
      # first was still that window (10.4 s, its requests all the warm-up's),
      # and read the capacity at 12 threads 9 % low where windows of the
      # open-loop runs at 12 read it within 1 % ("Session 35").
      def window_warmup = Integer(ENV.fetch("BENCH_ADVICE_WINDOW_WARMUP", "70"))
      # seconds of open-loop arrivals not counted on a fresh server
      def open_warmup = Integer(ENV.fetch("BENCH_ADVICE_OPEN_WARMUP", "2"))

      def thread_counts
        max = ENV["BENCH_ADVICE_MAX_THREADS"]&.then { |v| Integer(v) } || default_max_threads
        (1..max).to_a
      end

      def window_threads
        env = ENV["BENCH_ADVICE_WINDOW_THREADS"]
        env ? Integer(env) : (thread_counts.max / 2.0).ceil
      end

      # { url:, script:, script_args: } for Wrk.run: tagged from `base`,
      # stratified in blocks of `strata` (nil: iid draws).
      def wrk_target(port, base:, strata: nil)
        url = "http://127.0.0.1:#{port}#{path(strata)}"
        { url: url, opts: tagged? ? { script: Wrk.tagged_script, script_args: [base] } : {} }
      end

      # open_loop.rb arguments naming what to ask for.
      def open_args(port, strata:)
        ["--url", "http://127.0.0.1:#{port}#{path(tagged? ? strata : nil)}", *(tagged? ? ["--tag"] : [])]
      end

      # A server of this case: threads a count or "auto" (then without -q,
      # so that its `threads: a -> b` lines are in the log).
      def start(server, threads, db_path, extra: [])
        proc = Workloads::AdviceServer.new(server, app: workload.app_path(app), port: Util.free_port, threads: threads,
                                                   db: db_path, extra: extra)
        proc.command.delete("-q") if threads == "auto"
        proc.start
        proc.wait_ready(path: ready_path, timeout: boot_timeout)
        proc
      rescue StandardError
        proc&.stop
        raise
      end

      def setup; end
      def teardown; end
    end

    class Synthetic < Base
      attr_reader :share

      def initialize(workload, share)
        super(workload)
        @share = share
      end

      def key = share.to_s
      def label = "#{(share * 100).round} % CPU"
      def app = "advice.ru"
      def default_max_threads = ((1.6 / share).ceil + 3).clamp(6, 16)
      def path(strata = nil) = "/work?ms=#{workload.request_ms}&cpu=#{share}&q=#{workload.queries}#{"&st=#{strata}" if strata}"
      def description = "#{workload.request_ms.round} ms requests, #{label}, #{workload.queries} round trips to the stand-in database"
    end

    # Routes drawn by weight, the same sequence for the same tag base / seed
    # (bench/lib/bench/mixed_tagged.lua, open_loop.rb --mix).
    class Routes < Base
      def mix(strata)
        routes.map do |path, weight|
          q = [("st=#{strata}" if strata && tagged?)].compact
          full = q.empty? ? path : "#{path}#{path.include?('?') ? '&' : '?'}#{q.join('&')}"
          "#{full}@#{weight}"
        end.join(",")
      end

      # Requests of the sweep (strata given) hold the routes in proportion in
      # every ROUTE_BLOCK (mixed_tagged.lua's comment); the advice's window
      # (no strata) draws them iid, as a real app's traffic comes.
      ROUTE_BLOCK = 20

      def wrk_target(port, base:, strata: nil)
        args = [base, mix(strata), *(strata && tagged? ? [ROUTE_BLOCK] : [])]
        { url: "http://127.0.0.1:#{port}/", opts: { script: File.join(__dir__, "mixed_tagged.lua"), script_args: args } }
      end

      def open_args(port, strata:)
        ["--url", "http://127.0.0.1:#{port}/", "--mix", mix(strata), *(tagged? ? ["--tag"] : [])]
      end

      def route_text = routes.map { |p, w| "#{p.split('?').first} #{w} %" }.join(", ")
    end

    class Mixed < Routes
      def key = "mixed"
      def label = "mixed routes"
      def app = "advice_mixed.ru"
      def default_max_threads = 12
      # bench/apps/advice_mixed.ru's routes (its comment gives each one's work)
      def routes = [["/posts/1", 60], ["/feed", 30], ["/reports/1", 10]]

      def description
        "bench/apps/advice_mixed.ru: #{route_text} (fast reads 5 ms 40 % CPU, view rendering 13 ms 92 % CPU, " \
          "slow queries 81 ms 1 % CPU), one stand-in database round trip each"
      end
    end

    # examples/rails under Serval (`bundle exec serval -C config/puma.rb`, as
    # its README starts it) in production, PostgreSQL pinned to the client
    # CPU for the case (BENCH_ADVICE_PIN_PG, 1) as the stand-in database is.
    class Rails < Routes
      # How Serval starts the app; a Server so that ServerProcess can run it.
      class AppServer < Server
        def initialize(base)
          super(base.ctx)
          @base = base
        end

        def name = "serval"
        def version = @base.version
        def app_dir = File.join(ctx.root, "examples", "rails")
        def chdir = app_dir

        def env
          ctx.bundle_env.merge("BUNDLE_GEMFILE" => File.join(app_dir, "Gemfile"), "RAILS_ENV" => "production",
                               "SECRET_KEY_BASE" => Rails.secret, "DB_POOL" => "16", "RAILS_MAX_THREADS" => nil,
                               "RAILS_LOG_LEVEL" => "info", "METRICS_BIND" => nil, "WEB_CONCURRENCY" => nil)
        end

        def argv(app:, port:, threads:, workers: 1)
          t = threads == "auto" ? "auto" : "#{threads}:#{threads}"
          ["bundle", "exec", "serval", "-C", "config/puma.rb", "-e", "production", "-b", "tcp://127.0.0.1:#{port}",
           "-t", t, *(workers > 1 ? ["-w", workers.to_s] : []), app]
        end
      end

      def self.secret = @secret ||= ENV.fetch("SECRET_KEY_BASE") { SecureRandom.hex(64) }

      def key = "rails"
      def label = "Rails app"
      def app = "config.ru"
      def ready_path = "/up"
      def boot_timeout = [ctx.boot_timeout, 90].max
      # a fresh Rails process serves its first requests slowly (the first
      # /posts compiles its views: 126 ms; the first /db 339 ms): at 1
      # thread 1 s of warm-up left the sweep's point at 61 req/s where the
      # same requests warm run at ~105 (session 21, bench/NOTES.md). So
      # BENCH_ADVICE_RAILS_WARMUP (5) s closed loop, 10 s open loop.
      def sweep_warmup = Integer(ENV.fetch("BENCH_ADVICE_RAILS_WARMUP", "5"))
      # The advice's window is a rolling minute: this much load first leaves
      # only warm requests in it (a fresh process spent ~30 % more CPU a
      # request for its first ~25 s: bench/NOTES.md "a per-step fit"), as a
      # window from a server that has run a while. 0: the window starts cold.
      def window_warmup = Integer(ENV.fetch("BENCH_ADVICE_RAILS_WINDOW_WARMUP", "90"))
      def open_warmup = Integer(ENV.fetch("BENCH_ADVICE_OPEN_WARMUP", "10"))
      def default_max_threads = 16
      def routes = [["/db", 60], ["/posts", 30], ["/slow?ms=80", 10]]

      def description
        "examples/rails (Rails 8.1, production, production logging at info to the server's stdout), PostgreSQL: " \
          "#{route_text} (/db a 10-row read, /posts the index view, /slow?ms=80 a pg_sleep query)"
      end

      def start(server, threads, _db_path, extra: [])
        proc = ServerProcess.new(AppServer.new(server), app: "config.ru", port: Util.free_port, threads: threads,
                                                        extra: extra)
        proc.start
        proc.wait_ready(path: ready_path, timeout: boot_timeout)
        proc
      rescue StandardError
        proc&.stop
        raise
      end

      def unavailable_reason
        return "Rails 8.1 needs Ruby >= 3.2 (this is #{RUBY_VERSION})" if Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.2")

        app = File.join(ctx.root, "examples", "rails")
        status, out, = Util.capture(%w[bundle check], env: { "BUNDLE_GEMFILE" => File.join(app, "Gemfile"), "RUBYOPT" => nil },
                                                      chdir: app, timeout: 60)
        return "examples/rails is not bundled (bash .ci/rails.sh setup): #{out.lines.last}" unless status&.success?

        postmaster ? nil : "PostgreSQL is not running (bash .ci/rails.sh setup)"
      end

      # PostgreSQL's postmaster pid (its backends fork from it).
      def postmaster
        Dir["/var/lib/postgresql/*/main/postmaster.pid"].filter_map do |f|
          pid = Integer(File.readlines(f).first.to_s.strip, exception: false)
          pid && File.exist?("/proc/#{pid}") ? pid : nil
        rescue SystemCallError
          nil
        end.first
      end

      def pin_pg? = ENV.fetch("BENCH_ADVICE_PIN_PG", "1") != "0" && ctx.pin?

      # PostgreSQL (postmaster and every process it has) onto the client CPU
      # while the case runs; its new backends inherit that.
      def setup
        return unless pin_pg? && (pid = postmaster)

        @pg_pids = Util.process_tree(pid)
        @pg_pids.each { |p| system("taskset", "-a", "-p", "-c", ctx.client_cpu, p.to_s, out: File::NULL, err: File::NULL) }
        ctx.log "advice: rails: PostgreSQL (#{@pg_pids.size} processes) pinned to CPU #{ctx.client_cpu}"
      end

      def teardown
        return unless @pg_pids && (pid = postmaster)

        Util.process_tree(pid).each { |p| system("taskset", "-a", "-p", "-c", ctx.all_cpus, p.to_s, out: File::NULL, err: File::NULL) }
      end
    end
  end
end
