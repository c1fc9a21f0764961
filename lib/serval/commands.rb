# frozen_string_literal: true

module Serval
  # The one table of the commands that act on a running server, and every
  # way to send one: the launcher command (Launcher#enqueue), the signals the
  # supervising process maps to it (Signals::SINGLE, Signals::MASTER), the
  # signals a cluster worker acts on (Signals::WORKER), the control app's path
  # (ControlApp) and servalctl's name for it (Ctl). The read-only queries
  # (stats, thread-backtraces, ...) are answered by the control app itself and
  # are listed in QUERIES.
  #
  # A process acts on a command through its handler method, on_<command>
  # (Commands.dispatch): Supervisor and its modes, Cluster::Worker.
  module Commands
    DUMP_SIGNAL = Signal.list.key?("INFO") ? "INFO" : "PWR"

    # command => [signals, control path or nil, which processes act on it]:
    #   :every       single mode, the cluster master and each worker
    #   :supervisor  single mode and the cluster master
    #   :cluster     the cluster master only (single mode refuses it)
    # servalctl's name is the path without its slash.
    TABLE = {
      stop: [%w[TERM QUIT], "/stop", :every],
      halt: [%w[INT], "/halt", :every],
      restart: [%w[USR2], "/restart", :supervisor],
      phased_restart: [%w[USR1], "/phased-restart", :cluster],
      refork: [%w[URG], "/refork", :cluster],
      reopen_logs: [%w[HUP], "/reopen-logs", :every],
      add_worker: [%w[TTIN], nil, :cluster],
      remove_worker: [%w[TTOU], nil, :cluster],
      dump_threads: [[DUMP_SIGNAL], nil, :every]
    }.freeze

    # Commands only the process itself queues: :child (SIGCHLD in the
    # cluster master), :stopped (single mode's server ended), :ignore (a
    # master's signal that reached a worker), :mold (a worker the master
    # asked to become the mold).
    INTERNAL = %i[child stopped ignore mold].freeze

    # control path => the control app's method answering it
    QUERIES = {
      "/stats" => :stats,
      "/thread-backtraces" => :thread_backtraces,
      "/gc-stats" => :gc_stats,
      "/gvl-trace" => :gvl_trace,
      "/window" => :window,
      "/advice" => :advice
    }.freeze

    NAMES = TABLE.keys.freeze

    # Everything that may travel through a Signals pipe.
    QUEUEABLE = (NAMES + INTERNAL).freeze

    # command => its handler method (on_stop, on_halt, ...)
    HANDLERS = QUEUEABLE.to_h { |command| [command, :"on_#{command}"] }.freeze

    # Commands that need workers.
    CLUSTER_ONLY = TABLE.filter_map { |command, (_, _, scope)| command if scope == :cluster }.freeze

    # Commands a cluster worker acts on (the master forwards them as signals).
    WORKER = TABLE.filter_map { |command, (_, _, scope)| command if scope == :every }.freeze

    # signal => command
    SIGNALS = TABLE.each_with_object({}) { |(command, (signals, _, _)), h| signals.each { |s| h[s] = command } }.freeze

    # control path => command
    PATHS = TABLE.filter_map { |command, (_, path, _)| [path, command] if path }.to_h.freeze

    # servalctl's commands: the control paths without the slash, "status"
    # (a one-line stats), and advise (computed from /advice).
    CTL = (PATHS.keys + QUERIES.keys - ["/advice"]).map { |p| p.delete_prefix("/") }
                                                   .push("status", "advise").sort.freeze

    # Calls receiver's handler for command (private handlers too). Returns
    # true when the receiver has one, false when it does not act on command.
    def self.dispatch(receiver, command)
      handler = HANDLERS[command]
      return false unless handler && receiver.respond_to?(handler, true)

      receiver.__send__(handler)
      true
    end
  end
end
