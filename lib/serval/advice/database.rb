# frozen_string_literal: true

module Serval
  module Advice
    # Database connections: a pool per process as large as the threads that
    # take its connections (the request threads and `other_threads`: Action
    # Cable's workers, load_async's executor, Solid Queue's threads in the
    # server, as Serval::DbPools.other_takers counts them), so that no thread
    # waits for one; times processes per machine, times machines, plus other
    # clients (Sidekiq, cron, consoles), against the server's max_connections.
    module Database
      def self.call(threads:, processes:, machines: 1, extra_connections: 0, max_connections: nil, other_threads: 0)
        machines = Integer(machines)
        extra = Integer(extra_connections)
        others = Integer(other_threads)
        raise ArgumentError, "machines must be >= 1" if machines < 1
        raise ArgumentError, "extra_connections and other_threads must be >= 0" if extra.negative? || others.negative?

        per_process = threads + others
        per_machine = processes * per_process
        fleet = (machines * per_machine) + extra
        out = { per_process: per_process, request_threads: threads, other_threads: others,
                per_machine: per_machine, machines: machines, extra: extra, fleet: fleet,
                max_connections: max_connections, fits: nil, max_machines: nil, warnings: [] }
        return out unless max_connections

        max = Integer(max_connections)
        out[:max_connections] = max
        out[:fits] = fleet <= max
        out[:max_machines] = [(max - extra) / per_machine, 0].max
        unless out[:fits]
          out[:warnings] << format(
            "the fleet needs %d database connections (%d machines x %d processes x %d threads%s + %d other) " \
            "but the database allows %d: put PgBouncer (transaction pooling) between the app and the database, " \
            "or run at most %d machines", fleet, machines, processes, per_process,
            others.positive? ? format(" (%d request + %d other threads in the process)", threads, others) : "",
            extra, max, out[:max_machines]
          )
        end
        out
      end
    end
  end
end
