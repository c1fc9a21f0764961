# frozen_string_literal: true

require "serval/advice"
require "serval/errors"

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
      # runner: where the model runs (an Auto::ModelProcess: a child process,
      # so that its seconds of Ruby do not hold the serving process's GVL);
      # nil, or a runner that fails, runs it here.
      def recommend(window, stats: {}, machine: Machine.new, in_server: true, runner: nil, **options)
        facts = machine.to_h
        facts = facts.merge(worker(machine, stats)) if in_server
        advice = run(runner, window, machine: facts, **options)
        missing = Array(window[:missing] || window["missing"])
        unless missing.empty?
          who = missing.map { |m| m.is_a?(Hash) ? "worker #{m[:index] || m['index']}" : m.to_s }.join(", ")
          advice[:warnings] << "no window from #{who}: the advice rests on the other workers' requests"
        end
        advice
      end

      # The child's answer, or this process's when there is no child or it
      # failed (said in the advice's warnings).
      def run(runner, window, **options)
        return Advice.recommend(window, **options) unless runner

        runner.advice(window, **options)
      rescue ModelProcessTimeout
        raise # the CPU is busy: computing here would take the GVL from the requests
      rescue ModelProcessError => e
        Advice.recommend(window, **options).tap do |advice|
          advice[:warnings] << "computed in the server process (#{e.message})"
        end
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
