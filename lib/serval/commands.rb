# frozen_string_literal: true

module Serval
  # The one table of the commands that act on a running server, and every
  # way to send one: the launcher command (Launcher#enqueue), the signals the
  # supervising process maps to it (Signals::MASTER), the control app's path
  # (ControlApp) and servalctl's name for it (Ctl). The read-only queries
  # (stats, thread-backtraces, ...) are answered by the control app itself and
  # are listed in QUERIES.
  module Commands
    DUMP_SIGNAL = Signal.list.key?("INFO") ? "INFO" : "PWR"

    # command => [signals, control path or nil]; servalctl's name is the path
    # without its slash.
    TABLE = {
      stop: [%w[TERM QUIT], "/stop"],
      halt: [%w[INT], "/halt"],
      restart: [%w[USR2], "/restart"],
      phased_restart: [%w[USR1], "/phased-restart"],
      reopen_logs: [%w[HUP], "/reopen-logs"],
      add_worker: [%w[TTIN], nil],
      remove_worker: [%w[TTOU], nil],
      dump_threads: [[DUMP_SIGNAL], nil]
    }.freeze

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

    # signal => command
    SIGNALS = TABLE.each_with_object({}) { |(command, (signals, _)), h| signals.each { |s| h[s] = command } }.freeze

    # control path => command
    PATHS = TABLE.filter_map { |command, (_, path)| [path, command] if path }.to_h.freeze

    # servalctl's commands: the control paths without the slash, "status"
    # (a one-line stats), and advise (computed from /advice).
    CTL = (PATHS.keys + QUERIES.keys - ["/advice"]).map { |p| p.delete_prefix("/") }
                                                   .push("status", "advise").sort.freeze
  end
end
