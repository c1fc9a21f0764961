# frozen_string_literal: true

module Serval
  module Advice
    # Database connections: a pool per process as large as its threads (so
    # no thread waits for one), times processes per machine, times machines,
    # plus other clients (Sidekiq, cron, consoles), against the server's
    # max_connections.
    module Database
      def self.call(threads:, processes:, machines: 1, extra_connections: 0, max_connections: nil)
        machines = Integer(machines)
        extra = Integer(extra_connections)
        raise ArgumentError, "machines must be >= 1" if machines < 1
        raise ArgumentError, "extra_connections must be >= 0" if extra.negative?

        per_machine = processes * threads
        fleet = (machines * per_machine) + extra
        out = { per_process: threads, per_machine: per_machine, machines: machines, extra: extra, fleet: fleet,
                max_connections: max_connections, fits: nil, max_machines: nil, warnings: [] }
        return out unless max_connections

        max = Integer(max_connections)
        out[:max_connections] = max
        out[:fits] = fleet <= max
        out[:max_machines] = [(max - extra) / per_machine, 0].max
        unless out[:fits]
          out[:warnings] << format(
            "the fleet needs %d database connections (%d machines x %d processes x %d threads + %d other) " \
            "but the database allows %d: put PgBouncer (transaction pooling) between the app and the database, " \
            "or run at most %d machines", fleet, machines, processes, threads, extra, max, out[:max_machines]
          )
        end
        out
      end
    end
  end
end
