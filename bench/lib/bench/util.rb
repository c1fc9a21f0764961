# frozen_string_literal: true

require "socket"

module Bench
  # Process, timing and /proc helpers. Every child the harness starts is put in
  # its own process group and recorded here, so that an exception, Ctrl-C or a
  # plain exit can stop it (and only it) by its id.
  module Util
    @children = {}
    @children_lock = Mutex.new

    class << self
      # The median of the non-nil values (the mean of the middle two for an
      # even count); nil for none.
      def median(list)
        s = list.compact.sort
        s.empty? ? nil : (s[(s.size - 1) / 2] + s[s.size / 2]) / 2.0
      end

      # The p-quantile of a sorted list (nearest rank, as open_loop.rb); nil for none.
      def percentile(sorted, p)
        sorted.empty? ? nil : sorted[[(p * sorted.size).ceil - 1, 0].max]
      end

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # Spawn argv in a new process group; the pid is tracked until reaped.
      def spawn(argv, env: {}, **opts)
        pid = Process.spawn(env, *argv, pgroup: true, in: File::NULL, **opts)
        @children_lock.synchronize { @children[pid] = true }
        pid
      end

      # Wait for pid for at most timeout seconds; returns the Process::Status or nil.
      def wait(pid, timeout)
        deadline = now + timeout
        loop do
          got, status = Process.waitpid2(pid, Process::WNOHANG)
          if got
            forget(pid)
            return status
          end
          return nil if now >= deadline

          sleep 0.02
        end
      rescue Errno::ECHILD
        forget(pid)
        nil
      end

      # TERM the child's process group, then KILL it after grace seconds.
      def stop(pid, grace: 5)
        signal_group(pid, :TERM)
        status = wait(pid, grace)
        return status if status

        signal_group(pid, :KILL)
        wait(pid, 5)
      end

      def signal_group(pid, sig)
        Process.kill(sig, -pid)
      rescue Errno::ESRCH, Errno::EPERM
        begin
          Process.kill(sig, pid)
        rescue Errno::ESRCH, Errno::EPERM
          nil
        end
      end

      def forget(pid)
        @children_lock.synchronize { @children.delete(pid) }
      end

      # Stop every child still tracked (called from at_exit and signal paths).
      def stop_all
        pids = @children_lock.synchronize { @children.keys }
        pids.each { |pid| stop(pid, grace: 2) }
      end

      # Run argv to completion, bounded by timeout. Returns
      # [Process::Status or nil, combined stdout+stderr, timed_out?].
      def capture(argv, timeout:, env: {}, chdir: nil)
        reader, writer = IO.pipe
        opts = { out: writer, err: writer }
        opts[:chdir] = chdir if chdir
        pid = spawn(argv, env: env, **opts)
        writer.close
        out = read_until(reader, now + timeout)
        timed_out = out.nil?
        stop(pid, grace: 1) if timed_out
        status = timed_out ? nil : wait(pid, 10)
        [status, out || "", timed_out]
      ensure
        reader&.close
        writer&.close unless writer&.closed?
      end

      # Read io to EOF before deadline; nil when the deadline passed first.
      def read_until(io, deadline)
        out = +""
        loop do
          left = deadline - now
          return nil if left <= 0
          next unless io.wait_readable(left)

          chunk = io.read_nonblock(65_536, exception: false)
          return out if chunk.nil?

          out << chunk unless chunk == :wait_readable
        end
      end

      def which(cmd)
        ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).each do |dir|
          path = File.join(dir, cmd)
          return path if File.file?(path) && File.executable?(path)
        end
        nil
      end

      # A port that was free a moment ago on 127.0.0.1.
      def free_port
        server = TCPServer.new("127.0.0.1", 0)
        server.addr[1]
      ensure
        server&.close
      end

      # pid and all of its descendants, from /proc.
      def process_tree(root)
        parents = Hash.new { |h, k| h[k] = [] }
        Dir.glob("/proc/[0-9]*/stat").each do |path|
          stat = File.read(path)
          fields = stat[(stat.rindex(")") + 2)..].split
          parents[Integer(fields[1])] << Integer(File.basename(File.dirname(path)))
        rescue SystemCallError, ArgumentError, NoMethodError
          next
        end
        tree = []
        todo = [root]
        until todo.empty?
          pid = todo.shift
          tree << pid
          todo.concat(parents[pid])
        end
        tree
      end

      # User + system CPU seconds a process has used (all its threads), from
      # /proc/PID/stat (utime, stime in clock ticks); nil if it is gone.
      def cpu_seconds(pid)
        stat = File.read("/proc/#{pid}/stat")
        fields = stat[(stat.rindex(")") + 2)..].split
        (Integer(fields[11]) + Integer(fields[12])) / Float(Etc.sysconf(Etc::SC_CLK_TCK))
      rescue SystemCallError, ArgumentError
        nil
      end

      # VmRSS in kB of one process (0 if gone or a kernel thread).
      def rss_kb(pid)
        File.foreach("/proc/#{pid}/status") do |line|
          return Integer(line.split[1]) if line.start_with?("VmRSS:")
        end
        0
      rescue SystemCallError
        0
      end

      # Pss in kB (shared pages split between their users) of one process:
      # summed over a tree of forked workers it does not count shared pages
      # once per worker as VmRSS does. 0 if unreadable.
      def pss_kb(pid)
        File.foreach("/proc/#{pid}/smaps_rollup") do |line|
          return Integer(line.split[1]) if line.start_with?("Pss:")
        end
        0
      rescue SystemCallError
        0
      end

      def cpu_model
        File.foreach("/proc/cpuinfo") do |line|
          return line.split(":", 2)[1].strip if line.start_with?("model name")
        end
        "unknown"
      rescue SystemCallError
        "unknown"
      end

      # Online CPUs of the machine (not of our affinity mask, which the
      # harness narrows to the client CPU).
      def nproc
        @nproc ||= begin
          File.read("/sys/devices/system/cpu/online").split(",").sum do |range|
            a, b = range.split("-").map { |x| Integer(x) }
            b ? b - a + 1 : 1
          end
        rescue SystemCallError, ArgumentError
          require "etc"
          Etc.nprocessors
        end
      end
    end
  end
end
