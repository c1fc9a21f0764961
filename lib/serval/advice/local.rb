# frozen_string_literal: true

require "serval/advice"

module Serval
  module Advice
    # Advice inside a running server (the control app's /advice and the
    # advice log line): the launcher's window, this machine's CPUs and memory,
    # and a worker's memory (the largest worker's PSS in cluster mode, this
    # process's in single mode).
    module Local
      FLEET = %i[machines extra_connections db_max_connections target_rps].freeze

      module_function

      # window: Launcher#window's Hash; stats: Launcher#stats (for worker
      # pids); in_server: false when this process is not the server (servalctl
      # advise --from): no worker memory then, rather than servalctl's own.
      def recommend(window, stats: {}, machine: Machine.new, in_server: true, **options)
        facts = machine.to_h
        facts = facts.merge(worker(machine, stats)) if in_server
        advice = Advice.recommend(window, machine: facts, **options)
        missing = Array(window[:missing] || window["missing"])
        unless missing.empty?
          who = missing.map { |m| m.is_a?(Hash) ? "worker #{m[:index] || m['index']}" : m.to_s }.join(", ")
          advice[:warnings] << "no window from #{who}: the advice rests on the other workers' requests"
        end
        advice
      end

      # {worker_bytes:, worker_source:}: the largest PSS among the workers
      # (this process in single mode); empty when /proc cannot tell.
      def worker(machine, stats)
        pids = Array(stats[:worker_status] || stats["worker_status"]).filter_map { |w| w[:pid] || w["pid"] }
        pids = [Process.pid] if pids.empty?
        pss = pids.filter_map { |pid| (m = machine.process_memory(pid)) && m[:pss].positive? ? [m[:pss], pid] : nil }
        bytes, pid = pss.max_by(&:first)
        return {} unless bytes

        { worker_bytes: bytes, worker_source: "PSS of pid #{pid}#{" (largest of #{pss.size} workers)" if pss.size > 1}" }
      end
    end
  end
end
