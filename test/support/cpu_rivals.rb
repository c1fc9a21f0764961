# frozen_string_literal: true

require "rbconfig"

module Serval
  # For subprocess tests that pin a real exe/serval to one CPU and load that
  # CPU with busy processes (test/cpu_wait_test.rb, test/send_wait_test.rb):
  # the GVL hook's run-queue readings need Ruby 3.2+, taskset and Linux
  # schedstat.
  module CpuRivals
    def skip_unless_cpu_pinning
      skip "Ruby #{RUBY_VERSION} has no GVL event hook (needs 3.2+)" unless Serval::Native::GVL.supported?
      skip "needs taskset (util-linux)" unless system("taskset", "-c", "0", "true", out: File::NULL, err: File::NULL)
      skip "needs /proc/thread-self/schedstat" unless File.readable?("/proc/thread-self/schedstat")
    end

    # The CPU these tests pin to: of the CPUs this process may run on, the
    # one that was idle longest over a 0.3 s look (/proc/stat), so other
    # work on the machine (a benchmark pinned to CPU 0) does not stand in
    # for the test's own rivals. Chosen once per test process.
    def self.cpu
      @cpu ||= begin
        allowed = File.read("/proc/self/status")[/^Cpus_allowed_list:\s*(\S+)/, 1].to_s.split(",").flat_map do |r|
          a, b = r.split("-").map(&:to_i)
          (a..(b || a)).to_a
        end
        before = idle_times
        sleep 0.3
        after = idle_times
        allowed.max_by { |c| after.fetch(c, 0) - before.fetch(c, 0) } || 0
      rescue SystemCallError, IOError
        0
      end
    end

    # cpu number => idle + iowait jiffies
    def self.idle_times
      File.readlines("/proc/stat").grep(/\Acpu\d/).to_h do |line|
        f = line.split
        [f[0].delete_prefix("cpu").to_i, f[4].to_i + f[5].to_i]
      end
    end

    def cpu = CpuRivals.cpu.to_s

    # argv running exe/serval on CPU cpu with args; nice: at that niceness
    # (the rivals stay at 0, so a waking server thread waits its turn
    # instead of taking the CPU at once: the kernel's wake-up preemption
    # otherwise often runs it first, and its wait came out 1-2 % of a span
    # in one run of three)
    def pinned_serval(*args, nice: nil)
      ["taskset", "-c", cpu, *(nice ? ["nice", "-n", nice.to_s] : []), RbConfig.ruby, "-w",
       Serval::SubprocessServer::EXE, "-b", "tcp://127.0.0.1:0", *args]
    end

    # Runs the block with n busy processes pinned to CPU cpu (each has run
    # before the block starts), killed after.
    def with_rivals(n = 3)
      rivals = Array.new(n) { Process.spawn("taskset", "-c", cpu, RbConfig.ruby, "-e", "loop {}") }
      rivals.each { |pid| sleep 0.05 until File.read("/proc/#{pid}/stat").split[13].to_i.positive? }
      yield
    ensure
      rivals&.each do |pid|
        Process.kill(:KILL, pid)
        Process.wait(pid)
      end
    end
  end
end
