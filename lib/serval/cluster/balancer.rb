# frozen_string_literal: true

require "serval/ticker"
require "serval/load_meter"
require "serval/cluster/load_table"
require "serval/cluster/balance_policy"
require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # Each worker's main loop (Cluster::Worker) calls #tick every TICK
    # seconds, never per request; #start runs a "serval-balance" thread
    # instead for a caller without such a loop. A tick measures this worker's load over the last
    # `interval` seconds (GVL held, requests in flight), publishes it in its
    # LoadTable slot, reads its siblings' and applies the BalancePolicy's
    # decision to the native core (Core#balance_hold=, Core#balance_move;
    # ext/serval/balance.c). With gvl_balance off it still publishes (the
    # master's capacity signal reads the table) but never holds or moves.
    class Balancer
      TICK = 0.1

      attr_reader :policy

      # server: this worker's Server; held: callable giving GVL-held seconds
      # (the hook's total, or the process's CPU time without it).
      def initialize(server:, table:, index:, interval:, enabled:, log_writer:, held: nil)
        @server = server
        @table = table
        @index = index
        @interval = interval
        @log_writer = log_writer
        @policy = BalancePolicy.new(interval: interval, enabled: enabled)
        @meter = LoadMeter.new(interval)
        @held = held || LoadMeter.method(:gvl_held)
        @holding = false
        @figures = [0.0, 0.0, 0]
      end

      def start
        # a bad tick must not end balancing for the worker's life: logged once, the thread goes on
        @ticker = Ticker.new("serval-balance", TICK, @log_writer, first: :tick, on_error: lambda { |e|
          @log_writer.error("serval: balance tick failed (#{e.class}: #{e.message})") unless @failed
          @failed = true
        }).start { tick }
        self
      end

      # Stops the thread; the slot says `stopping` so siblings and the
      # master stop counting on this worker. A hold stays: the drain that
      # follows takes the listeners away for good.
      def stop
        @ticker&.stop(2)
        publish(stopping: true)
      end

      # For the worker's check-in (per-worker Prometheus gauges).
      def stats
        util, busy, = @figures
        { balance_holding: @holding ? 1 : 0, balance_moved: core.balance_moved,
          balance_gvl_utilization: util.round(3), balance_busy_threads: busy.round(2) }
      end

      # One measurement and decision (the thread calls it every TICK).
      def tick(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
        seconds, busy_now, connections, shed, @max_threads = LoadMeter.server_figures(@server)
        @meter.add(now, @held.call, busy_now, shed, request_seconds: seconds)
        @figures = @meter.figures
        util, busy, = @figures
        siblings = @table.read(max_age: @interval).reject { |e| e.index == @index || e.pid == Process.pid }
        decision = @policy.decide(BalancePolicy::Own.new(util, busy), siblings, now)
        apply(decision, util, busy)
        publish(connections: connections)
        decision
      end

      private

      def core
        @server.core
      end

      def apply(decision, util, busy)
        if decision.hold != @holding
          @holding = decision.hold
          core.balance_hold = @holding
          @log_writer.debug(format("serval: worker %<i>d %<what>s (GVL %<u>.2f, %<b>.1f requests in flight%<t>s)",
                                   i: @index, what: @holding ? "stops accepting" : "accepts again", u: util, b: busy,
                                   t: decision.target ? format("; worker %d has headroom", decision.target.index) : ""))
        end
        core.balance_move if decision.move
      end

      def publish(connections: 0, stopping: false)
        util, busy, shed = @figures
        @table.write(@index, pid: Process.pid, util: util, busy: busy, max_threads: @max_threads || 0,
                             connections: connections, moved: core.balance_moved, hold: @holding,
                             shedding: shed.positive?, stopping: stopping)
      rescue IOError, SystemCallError
        nil
      end
    end
  end
end
