# frozen_string_literal: true

require "etc"

module Serval
  module Advice
    # What a machine (or container) gives a server, read from files under a
    # root so tests can point it at fixture trees:
    #
    # - CPUs: the cgroup quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
    #   `cpu.cfs_period_us`; the smallest along the cgroup's path up to the
    #   hierarchy's root) and the scheduler affinity (`Cpus_allowed_list` in
    #   /proc/<pid>/status; Etc.nprocessors, which honours affinity on Linux,
    #   when that file is missing). Usable = the smaller. Not `nproc` of the
    #   host: a container limited to 2 CPUs on a 64-core host has 2.
    # - Memory: the cgroup limit (v2 `memory.max`, v1
    #   `memory.limit_in_bytes`), else /proc/meminfo MemAvailable.
    # - A worker's memory: /proc/<pid>/smaps_rollup Pss (its fair share of
    #   pages shared after fork) and USS (Private_Clean + Private_Dirty +
    #   Private_Hugetlb: what it would free on exit).
    class Machine
      V1_UNLIMITED = 1 << 60 # v1 reports "no limit" as a page-rounded 2^63 - 1

      def initialize(root: "/", pid: "self")
        @root = root
        @pid = pid.to_s
      end

      # {usable:, quota:, affinity:, source:}
      def cpus
        quota, qsource = cpu_quota
        affinity, list = affinity_cpus
        usable = quota ? [quota, affinity].min : affinity.to_f
        source = quota && quota < affinity ? qsource : "sched affinity (Cpus_allowed_list #{list || '?'}: #{affinity})"
        { usable: usable, quota: quota, affinity: affinity, source: source }
      end

      # {limit:, available:, budget:, source:}; budget is what workers may use.
      def memory
        limit, lsource = memory_limit
        available = meminfo("MemAvailable")
        budget = [limit, available].compact.min
        source = limit && (available.nil? || limit <= available) ? lsource : "/proc/meminfo MemAvailable"
        { limit: limit, available: available, budget: budget, source: budget && source }
      end

      # {pss:, uss:} in bytes for one process, nil when unreadable.
      def process_memory(pid = @pid)
        text = read("proc/#{pid}/smaps_rollup") or return nil
        kb = ->(field) { text[/^#{field}:\s+(\d+) kB/, 1].to_i * 1024 }
        { pss: kb.call("Pss"), uss: kb.call("Private_Clean") + kb.call("Private_Dirty") + kb.call("Private_Hugetlb") }
      end

      # The facts the recommender reads.
      def to_h
        c = cpus
        m = memory
        { cpus: c[:usable], cpu_source: c[:source], memory_bytes: m[:budget], memory_source: m[:source] }
      end

      private

      def read(rel)
        File.read(File.join(@root, rel))
      rescue SystemCallError
        nil
      end

      def v2?
        File.exist?(File.join(@root, "sys/fs/cgroup/cgroup.controllers"))
      end

      # Directories from the process's cgroup up to the hierarchy root.
      def chain(mount, rel_path)
        base = File.join(@root, "sys/fs/cgroup", mount)
        parts = rel_path.to_s.split("/").reject(&:empty?)
        dirs = parts.size.downto(0).map { |n| File.join(base, *parts.first(n)) }
        dirs.select { |d| File.directory?(d) }
      end

      def cgroup_line(controller)
        text = read("proc/#{@pid}/cgroup") or return nil
        text.each_line.map { |l| l.chomp.split(":", 3) }.find do |_id, ctrls, _path|
          controller.nil? ? ctrls.to_s.empty? : ctrls.to_s.split(",").include?(controller)
        end
      end

      def v1_dirs(controller)
        line = cgroup_line(controller) or return []
        mounts = [line[1], controller, line[1].split(",").sort.join(",")].uniq
        mount = mounts.find { |m| File.directory?(File.join(@root, "sys/fs/cgroup", m)) } or return []
        chain(mount, line[2])
      end

      def v2_dirs
        chain("", cgroup_line(nil)&.last)
      end

      def cpu_quota
        if v2?
          found = v2_dirs.filter_map do |dir|
            quota, period = File.read(File.join(dir, "cpu.max")).split rescue next
            quota != "max" && period.to_f.positive? ? quota.to_f / period.to_f : nil
          end
          return [found.min, "cgroup v2 cpu.max"] if found.any?
        else
          found = v1_dirs("cpu").filter_map do |dir|
            quota = Integer(File.read(File.join(dir, "cpu.cfs_quota_us")).strip) rescue next
            period = Integer(File.read(File.join(dir, "cpu.cfs_period_us")).strip) rescue next
            quota.positive? && period.positive? ? quota.to_f / period : nil
          end
          return [found.min, "cgroup v1 cpu.cfs_quota_us"] if found.any?
        end
        [nil, nil]
      end

      def memory_limit
        if v2?
          found = v2_dirs.filter_map do |dir|
            v = File.read(File.join(dir, "memory.max")).strip rescue next
            v == "max" ? nil : Integer(v, exception: false)
          end
          [found.min, "cgroup v2 memory.max"]
        else
          found = v1_dirs("memory").filter_map do |dir|
            v = Integer(File.read(File.join(dir, "memory.limit_in_bytes")).strip, exception: false) rescue next
            v && v < V1_UNLIMITED ? v : nil
          end
          [found.min, "cgroup v1 memory.limit_in_bytes"]
        end
      end

      # [CPUs the scheduler lets this process use, their list as the kernel
      # gives it (nil without one: then every CPU)]
      def affinity_cpus
        list = read("proc/#{@pid}/status")&.[](/^Cpus_allowed_list:\s*(\S+)/, 1)
        return [Etc.nprocessors, nil] unless list

        count = list.split(",").sum do |range|
          lo, hi = range.split("-").map { |x| Integer(x) }
          hi ? hi - lo + 1 : 1
        end
        [count, list]
      end

      def meminfo(field)
        kb = read("proc/meminfo")&.[](/^#{field}:\s+(\d+) kB/, 1)
        kb && kb.to_i * 1024
      end
    end
  end
end
