# frozen_string_literal: true

require "rbconfig"
require "socket"
require "tmpdir"
require "fileutils"
require "securerandom"

module RailsIntegration
  # examples/rails run as a real subprocess under its own bundle. stdout and
  # stderr are pipes (so the app's stdout logging goes through a pipe, as
  # under systemd or docker); reader threads copy them to log files and
  # remember every line so a test can wait for one without polling.
  class AppServer
    ROOT = File.expand_path("../../..", __dir__)
    APP = File.join(ROOT, "examples", "rails")
    BUNDLE = File.join(RbConfig::CONFIG["bindir"], "bundle")

    attr_reader :name, :port, :metrics_port, :env, :log_dir, :pid

    def self.free_port
      server = TCPServer.new("127.0.0.1", 0)
      server.local_address.ip_port
    ensure
      server&.close
    end

    # command: :rails_server (bin/rails server -u serval), :serval_config
    # (bundle exec serval -C config/puma.rb) or :puma_config (bundle exec
    # puma -C config/puma.rb, the reference); env: extra environment.
    def initialize(name, command:, env: {})
      @name = name
      @port = self.class.free_port
      @metrics_port = self.class.free_port
      @command = argv(command)
      @env = base_env.merge("PORT" => @port.to_s, "METRICS_BIND" => "tcp://127.0.0.1:#{@metrics_port}").merge(env)
      @log_dir = Dir.mktmpdir("serval-rails-#{name}-")
      @lines = []
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @eof = 0
    end

    def argv(command)
      case command
      when :rails_server then [RbConfig.ruby, "bin/rails", "server", "-u", "serval", "-b", "127.0.0.1", "-p", @port.to_s]
      when :serval_config then [RbConfig.ruby, BUNDLE, "exec", "serval", "-C", "config/puma.rb"]
      when :puma_config then [RbConfig.ruby, BUNDLE, "exec", "puma", "-C", "config/puma.rb"]
      else raise ArgumentError, "unknown command #{command.inspect}"
      end
    end

    # The environment of a user's shell, not the test's bundle.
    def base_env
      env = defined?(Bundler) ? Bundler.original_env : ENV.to_h
      env = env.reject { |k, _| k.start_with?("BUNDLE_", "BUNDLER_") || %w[RUBYOPT RUBYLIB].include?(k) }
      env.merge("BUNDLE_GEMFILE" => File.join(APP, "Gemfile"), "RAILS_ENV" => "production",
                "SECRET_KEY_BASE" => ENV.fetch("SECRET_KEY_BASE") { SecureRandom.hex(64) },
                "RAILS_LOG_LEVEL" => "info", "WEB_CONCURRENCY" => nil, "BUNDLE_VERSION" => ENV["BUNDLE_VERSION"],
                "SOLID_QUEUE_IN_PUMA" => nil, "BUILD_SHA" => nil, "DB_POOL" => nil)
    end

    def command_line = @command.drop(1).join(" ")

    def start
      out_r, out_w = IO.pipe
      err_r, err_w = IO.pipe
      @pid = Process.spawn(@env.compact, *@command, chdir: APP, out: out_w, err: err_w, in: File::NULL,
                                                    pgroup: true, unsetenv_others: true)
      out_w.close
      err_w.close
      @readers = [tee(out_r, "stdout"), tee(err_r, "stderr")]
      @waiter = Process.detach(@pid)
      self
    end

    # The first line (stdout or stderr) matching pattern, waiting at most
    # timeout seconds; raises with the logs when it does not come.
    def wait_for(pattern, timeout: 60)
      deadline = now + timeout
      @mutex.synchronize do
        loop do
          line = @lines.find { |l| l.match?(pattern) }
          return line.match(pattern) if line
          break if @eof >= 2

          left = deadline - now
          break if left <= 0

          @cond.wait(@mutex, [left, 0.5].min)
        end
      end
      raise "#{@name}: no line matching #{pattern.inspect} within #{timeout}s (exited: #{exited?})\n#{logs}"
    end

    # Waits (bounded) until at least count lines match; returns them all.
    def wait_for_lines(pattern, count, timeout: 15)
      deadline = now + timeout
      @mutex.synchronize do
        loop do
          found = @lines.grep(pattern)
          return found if found.size >= count || @eof >= 2

          left = deadline - now
          return found if left <= 0

          @cond.wait(@mutex, [left, 0.5].min)
        end
      end
    end

    def lines_matching(pattern)
      @mutex.synchronize { @lines.grep(pattern) }
    end

    # Boot: "Listening on" for the app's port (and the workers in cluster mode).
    def boot(workers: 0, timeout: 90)
      start unless @pid
      wait_for(/Listening on http:\/\/\S+:#{@port}\b/, timeout: timeout)
      if workers.positive? && !lines_matching(/starting in single mode/).empty?
        raise "#{@name}: #{workers} workers wanted (WEB_CONCURRENCY) but the server started in single mode\n#{logs}"
      end
      workers.times { |i| wait_for(/- Worker #{i} \(PID: \d+\) booted/, timeout: timeout) }
      self
    end

    def exited?
      @waiter && !@waiter.alive?
    end

    # TERM (graceful), then KILL of the whole process group.
    def stop(timeout: 30)
      return unless @pid

      signal("TERM", @pid)
      return if @waiter.join(timeout)

      warn "#{@name}: still running #{timeout}s after TERM; killing"
      signal("KILL", -@pid)
      @waiter.join(5)
    ensure
      @readers&.each { |t| t.join(5) }
    end

    # TERM to the server alone (what a supervisor such as systemd or
    # Kubernetes sends) and a bounded wait for it to exit: its
    # Process::Status, nil when it is still running after timeout.
    def terminate(timeout: 30)
      signal("TERM", @pid)
      @waiter.join(timeout) && @waiter.value
    end

    # [[pid, args], ...] of the processes still in the server's process
    # group (it is spawned as the group's leader; whatever it forks, and
    # their forks, stay in the group unless they call setsid), from ps.
    def group_processes
      out = IO.popen(["ps", "-e", "-o", "pid=,pgid=,args="], &:read)
      out.lines.filter_map do |line|
        pid, pgid, args = line.strip.split(/\s+/, 3)
        [Integer(pid), args.to_s] if Integer(pgid) == @pid
      end
    end

    # Polls ps until the process group is empty, at most timeout seconds;
    # returns what is left (empty when all are gone).
    def wait_group_empty(timeout: 15)
      deadline = now + timeout
      loop do
        left = group_processes
        return left if left.empty? || now > deadline

        sleep 0.2
      end
    end

    def logs
      %w[stdout stderr].map { |s| "--- #{s}:\n#{read_log(s).lines.last(60).join}" }.join
    end

    def cleanup(passed)
      stop
      # A test that failed may leave forks behind (a job supervisor): the
      # whole group goes, so that nothing outlives the test.
      signal("KILL", -@pid) if @pid && !group_processes.empty?
      if passed
        FileUtils.rm_rf(@log_dir)
      else
        warn "#{@name}: logs kept in #{@log_dir}"
      end
    end

    private

    def signal(sig, pid)
      Process.kill(sig, pid)
    rescue Errno::ESRCH
      nil
    end

    def tee(pipe, stream)
      Thread.new do
        File.open(File.join(@log_dir, "#{stream}.log"), "w") do |log|
          log.sync = true
          pipe.each_line do |line|
            log.write(line)
            @mutex.synchronize do
              @lines << line
              @cond.broadcast
            end
          end
        end
      ensure
        pipe.close
        @mutex.synchronize do
          @eof += 1
          @cond.broadcast
        end
      end
    end

    def read_log(stream)
      path = File.join(@log_dir, "#{stream}.log")
      File.exist?(path) ? File.read(path) : ""
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
