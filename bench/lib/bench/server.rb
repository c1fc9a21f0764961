# frozen_string_literal: true

module Bench
  # A server adapter says how to start one server with an app, a port and a
  # thread count. Adapters live in bench/lib/bench/servers/, one file each, and
  # register themselves by name; see servers/puma.rb for the smallest one.
  class Server
    @registry = {}

    class << self
      attr_reader :registry

      def register(name)
        Server.registry[name.to_s] = self
      end
    end

    attr_reader :ctx

    def initialize(ctx)
      @ctx = ctx
    end

    def name
      raise NotImplementedError
    end

    # Human-readable version string, recorded with every result.
    def version
      raise NotImplementedError
    end

    # argv that starts the server in the foreground (without the CPU pinning).
    # workers: processes (1 = single mode); threads: threads per process;
    # max_connections (only passed by workloads that hold thousands of
    # connections open): raise the server's own cap on open connections to
    # this, for adapters that have one (others ignore it: accept `**`).
    def argv(app:, port:, threads:, workers: 1, max_connections: nil)
      raise NotImplementedError
    end

    # Whether it runs the workload's Rack app (nginx, the limit line, does not:
    # it only runs in workloads that take a limit line).
    def rack? = true

    # Whether it runs only where asked for: in workloads that name it in
    # server_names, or when --servers names it (iodine, nginx).
    def opt_in? = false

    # How the budget (workers processes x threads threads) maps onto this
    # server's own model, for the tables: e.g. "1 x 4 threads".
    def layout(threads:, workers: 1)
      "#{workers} x #{threads} threads"
    end

    # Processes this server really runs for the requested workers (Serval
    # before cluster mode: 1).
    def effective_workers(workers)
      workers
    end

    # Whether the adapter's gem (or executable) is installed; a server that is
    # not is skipped with this reason.
    def unavailable_reason
      nil
    end

    def env
      ctx.bundle_env.merge("RACK_ENV" => "production")
    end

    # The version of gem in bench's bundle (one `bundle list` per run).
    def gem_version(gem)
      Server.bundle_versions(ctx)[gem]
    end

    def self.bundle_versions(ctx)
      @bundle_versions ||= begin
        _status, out, = Util.capture(%w[bundle list], env: ctx.bundle_env, chdir: ctx.bench_dir, timeout: 60)
        out.scan(/^\s+\* (\S+) \(([^)]+)\)/).to_h
      end
    end

    def chdir
      ctx.root
    end

    def start(app:, port:, threads:, workers: 1, cpus: nil, max_connections: nil)
      ServerProcess.new(self, app: app, port: port, threads: threads, workers: workers, cpus: cpus,
                              max_connections: max_connections).start
    end
  end

  # One running server: spawned pinned to the server CPU, in its own process
  # group, its output going to a log file in the run's scratch directory.
  class ServerProcess
    attr_reader :server, :port, :pid, :command, :log_path, :threads, :workers

    # extra: flags inserted before the app path (e.g. --max-queue-time 0.05);
    # env: added to the server's environment; max_connections: for servers
    # whose argv takes it (the connections workload).
    def initialize(server, app:, port:, threads:, workers: 1, cpus: nil, extra: [], env: {}, max_connections: nil)
      @server = server
      @port = port
      @app = app
      @threads = threads
      @workers = workers
      args = { app: app, port: port, threads: threads, workers: workers }
      args[:max_connections] = max_connections if max_connections
      argv = server.argv(**args)
      argv = argv[0..-2] + extra + [argv[-1]] unless extra.empty?
      @command = server.ctx.pin_server(argv, cpus: cpus)
      @env = server.env.merge(env)
      @log_path = File.join(server.ctx.scratch, "#{server.name}-#{File.basename(app, '.ru')}-#{port}.log")
    end

    def start
      @pid = Util.spawn(@command, env: @env, chdir: server.chdir, out: @log_path, err: @log_path)
      self
    end

    def alive?
      Process.waitpid(@pid, Process::WNOHANG).nil?
    rescue Errno::ECHILD
      false
    end

    # Poll GET path until the server answers; raise with the log tail if it
    # dies or does not answer within timeout seconds.
    def wait_ready(path: "/", timeout: ctx.boot_timeout)
      deadline = Util.now + timeout
      last_error = nil
      while Util.now < deadline
        raise Error, "#{server.name} exited during boot:\n#{log_tail}" unless alive?

        begin
          return HTTP.get("127.0.0.1", port, path, timeout: 2)
        rescue SystemCallError, HTTP::Timeout, IOError => e
          last_error = e
          sleep 0.05
        end
      end
      raise Error, "#{server.name} did not answer on #{port} within #{timeout}s (#{last_error&.class}):\n#{log_tail}"
    end

    def stop
      Util.stop(@pid) if @pid
      @pid = nil
    end

    def rss_kb
      Util.process_tree(@pid).sum { |pid| Util.rss_kb(pid) }
    end

    # User + system CPU seconds of the whole process tree (nginx's worker,
    # a forked Iodine worker), nil if the server is gone.
    def cpu_seconds
      times = Util.process_tree(@pid).map { |pid| Util.cpu_seconds(pid) }.compact
      times.empty? ? nil : times.sum
    end

    def log_tail(lines = 20)
      File.exist?(@log_path) ? File.readlines(@log_path).last(lines).join : "(no log)"
    end

    private

    def ctx
      server.ctx
    end
  end

  class Error < StandardError; end
end
