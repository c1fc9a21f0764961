# frozen_string_literal: true

module Serval
  module Advice
    # Processes per machine: one per usable CPU (a process cannot use more
    # than one for Ruby code: the GVL), and no more than the memory budget
    # holds with headroom.
    #
    # facts: {cpus:, cpu_source:, memory_bytes:, memory_source:,
    #         worker_bytes:, worker_source:} (Machine#to_h plus a worker's
    # PSS or USS after warm-up); any of them may be missing.
    module Processes
      def self.call(facts, headroom:)
        facts = (facts || {}).to_h
        cpus = facts[:cpus]&.to_f
        budget = facts[:memory_bytes]
        worker = facts[:worker_bytes]
        warnings = []
        by_cpu = cpus && [cpus.floor, 1].max
        by_memory = budget && worker&.positive? ? ((budget * (1 - headroom)) / worker).floor : nil
        if cpus.nil?
          warnings << "no machine facts: assuming one process"
        elsif cpus < 1
          warnings << format("only %.2f CPUs usable (%s): one process will not reach the GVL's req/s", cpus,
                             facts[:cpu_source] || "unknown")
        end
        if budget && worker.nil?
          warnings << "a worker's memory (PSS/USS) is not known: processes are not bounded by memory"
        end
        if by_memory&.< 1
          warnings << format("one worker (%d MiB) does not fit the memory budget (%d MiB with %d %% headroom)",
                             worker / 1_048_576, budget / 1_048_576, (headroom * 100).round)
        end
        processes = [by_cpu || 1, by_memory].compact.min
        processes = 1 if processes < 1
        bound = by_memory && by_cpu && by_memory < by_cpu ? "memory" : "cpu"
        { processes: processes, by_cpu: by_cpu, by_memory: by_memory, bound: by_cpu ? bound : "unknown",
          cpus: cpus, cpu_source: facts[:cpu_source], memory_bytes: budget, memory_source: facts[:memory_source],
          worker_bytes: worker, worker_source: facts[:worker_source], headroom: headroom, warnings: warnings }
      end
    end
  end
end
