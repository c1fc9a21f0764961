# frozen_string_literal: true

require "tmpdir"
require "fileutils"
require "rbconfig"
require "socket"

module Serval
  # Subprocess tier: runs a real command (exe/serval by default) in its own
  # temp dir. stdout/stderr go through pipes that a reader thread copies to
  # log files while watching for lines, so waiting for "Listening on" needs
  # no polling. stop sends TERM, then INT, then KILL, each after a deadline.
  class SubprocessServer
    ROOT = File.expand_path("../..", __dir__)
    EXE = File.join(ROOT, "exe", "serval")
    HELLO = %(run ->(env) { [200, {"content-type" => "text/plain"}, ["hello\\n"]] }\n)

    attr_reader :dir, :pid, :status, :stdout_path, :stderr_path

    # files: {"relative/path" => contents} written into the temp dir.
    # command: full argv; defaults to ruby exe/serval ARGS.
    def initialize(args = [], files: { "config.ru" => HELLO }, command: nil, env: {}, spawn_opts: {})
      @dir = Dir.mktmpdir("serval-test-")
      files.each do |path, body|
        full = File.join(@dir, path)
        FileUtils.mkdir_p(File.dirname(full))
        File.write(full, body)
      end
      @command = command || [RbConfig.ruby, "-w", EXE, *args]
      @spawn_opts = spawn_opts # e.g. { 3 => socket } to pass a descriptor
      @env = { "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile"), "RUBYOPT" => [ENV["RUBYOPT"], "-rbundler/setup"].compact.join(" ") }.merge(env)
      @stdout_path = File.join(@dir, "stdout.log")
      @stderr_path = File.join(@dir, "stderr.log")
      @lines = { out: [], err: [] }
      @mutex = Mutex.new
      @cond = ConditionVariable.new
    end

    def start
      out_r, out_w = IO.pipe
      err_r, err_w = IO.pipe
      @pid = Process.spawn(@env, *@command, chdir: @dir, out: out_w, err: err_w, in: File::NULL, pgroup: true, **@spawn_opts)
      out_w.close
      err_w.close
      @readers = [tee(out_r, @stdout_path, :out), tee(err_r, @stderr_path, :err)]
      @waiter = Process.detach(@pid)
      self
    end

    # Waits for a stdout (or stderr) line matching pattern; returns the
    # MatchData, or raises with both logs when the deadline passes or the
    # process exits first.
    def wait_for(pattern, stream: :out, timeout: 10)
      wait_for_count(pattern, 1, stream: stream, timeout: timeout).first
    end

    # Waits until count lines of stream match pattern; returns their matches.
    def wait_for_count(pattern, count, stream: :out, timeout: 10)
      deadline = now + timeout
      @mutex.synchronize do
        loop do
          found = @lines[stream].select { |l| l.match?(pattern) }
          return found.map { |l| l.match(pattern) } if found.size >= count
          break if @eof && @eof >= 2

          left = deadline - now
          break if left <= 0

          @cond.wait(@mutex, [left, 0.5].min)
        end
      end
      raise "fewer than #{count} lines matching #{pattern.inspect} within #{timeout}s (exited: #{exited?})\n#{logs}"
    end

    # Boot: waits for "Listening on" and returns the first port printed.
    def boot(timeout: 15)
      start unless @pid
      match = wait_for(%r{Listening on (?:http://\S+:(\d+)|unix://\S+)}, timeout: timeout)
      @port = match[1]&.to_i
      self
    end

    def port
      @port
    end

    # A port that was free a moment ago (for commands that need a number).
    def self.free_port
      server = TCPServer.new("127.0.0.1", 0)
      server.local_address.ip_port
    ensure
      server&.close
    end

    # For runs that print nothing (-q): polls connect every 10 ms until the
    # port answers, the process exits, or the deadline passes.
    def wait_port(port, host: "127.0.0.1", timeout: 15)
      deadline = now + timeout
      loop do
        TCPSocket.new(host, port).close
        return self
      rescue SystemCallError
        raise "port #{port} never answered (exited: #{exited?})\n#{logs}" if exited? || now > deadline

        sleep 0.01
      end
    end

    def exited?
      !@waiter.alive?
    end

    # Waits for the process to exit on its own; returns Process::Status or
    # nil. Once it exited, its last lines are in the logs (the readers get a
    # moment to copy them; a child still holding the pipes does not block).
    def wait(timeout)
      return nil unless @waiter.join(timeout)

      @readers&.each { |t| t.join(2) }
      @status = @waiter.value
    end

    # TERM, then INT, then KILL; returns the Process::Status.
    def stop(term_timeout: 10, int_timeout: 5)
      return @status if @status || @pid.nil?

      [["TERM", term_timeout], ["INT", int_timeout], ["KILL", 5]].each do |sig, timeout|
        signal(sig)
        return @status if wait(timeout)
      end
      @status
    ensure
      @readers&.each { |t| t.join(2) }
    end

    def signal(sig)
      Process.kill(sig, @pid)
    rescue Errno::ESRCH
      nil
    end

    def stdout
      File.read(@stdout_path)
    end

    def stderr
      File.read(@stderr_path)
    end

    def logs
      "--- stdout (#{@stdout_path}):\n#{read_or_empty(@stdout_path)}" \
        "--- stderr (#{@stderr_path}):\n#{read_or_empty(@stderr_path)}"
    end

    # Keeps the temp dir (and says where) when the test failed.
    def cleanup(passed)
      stop if @pid
      if passed
        FileUtils.rm_rf(@dir)
      else
        $stderr.puts "\nserver dir kept: #{@dir}\n  #{@stdout_path}\n  #{@stderr_path}"
      end
    end

    private

    def tee(pipe, path, stream)
      Thread.new do
        File.open(path, "w") do |log|
          log.sync = true
          pipe.each_line do |line|
            log.write(line)
            @mutex.synchronize do
              @lines[stream] << line
              @cond.broadcast
            end
          end
        end
      ensure
        pipe.close
        @mutex.synchronize do
          @eof = (@eof || 0) + 1
          @cond.broadcast
        end
      end
    end

    def read_or_empty(path)
      File.exist?(path) ? File.read(path) : ""
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end

  # Include into a test class: spawn_server registers the server so it is
  # stopped (and its logs kept on failure) after each test.
  module SubprocessHelpers
    def spawn_server(args = [], **kw)
      server = SubprocessServer.new(args, **kw)
      (@subprocess_servers ||= []) << server
      server
    end

    def after_teardown
      (@subprocess_servers || []).each { |s| s.cleanup(passed?) }
      super
    end
  end
end
