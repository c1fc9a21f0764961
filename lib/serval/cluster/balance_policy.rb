# frozen_string_literal: true

require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # When a worker stops taking connections and when it moves one away; a
    # pure object fed the worker's own windowed load and its siblings'
    # (LoadTable entries), so it is tested without processes.
    #
    # - hold: this worker's GVL is saturated (held >= SATURATED of the
    #   window) while a sibling is not, and that sibling runs fewer
    #   requests. The worker accepts nothing; the kernel gives new
    #   connections to the siblings that listen.
    # - move: the hold has lasted a whole interval, and this worker runs at
    #   least GAP more requests than that sibling: one keep-alive connection
    #   ends after its next response ("connection: close"), and its client
    #   reconnects to a worker that listens. At most one move per interval,
    #   and the interval restarts after each, so the windows on both sides see
    #   the effect of one move before the next is decided (no thrash).
    #
    # A sibling that holds, stops or is saturated itself is never a target:
    # two workers can never hold because of each other (each would have to
    # see the other below SATURATED while being above it).
    class BalancePolicy
      # share of the window the GVL was held: GVL-bound. 0.75, not higher: with
      # keep-alive clients spread 3 + 1 over two workers at 35 % CPU the busy
      # one holds the GVL ~81 % of the time (a closed loop of three clients,
      # bench/NOTES.md "Balancing: 4 keep-alive clients"), and 2 + 2 serves
      # ~7 % more; at 0.85 that split was never corrected. 2 + 2 itself never
      # moves (GAP), whatever the share.
      SATURATED = 0.75
      GAP = 1.5        # requests in flight: moving one client must not just swap the imbalance

      Own = Struct.new(:util, :busy)
      Decision = Struct.new(:hold, :move, :target)

      attr_reader :moves

      # interval: seconds an imbalance must last before a move, and between moves.
      def initialize(interval:, enabled: true)
        @interval = interval
        @enabled = enabled
        @since = nil # when the current hold began, or the last move
        @moves = 0
      end

      # own: Own (or anything with util and busy); siblings: LoadTable
      # entries of the other live workers. Returns a Decision.
      def decide(own, siblings, now)
        target = @enabled && own.util >= SATURATED ? target_for(own, siblings) : nil
        unless target
          @since = nil
          return Decision.new(false, false, nil)
        end

        @since ||= now
        move = own.busy - target.busy >= GAP && now - @since >= @interval
        if move
          @since = now
          @moves += 1
        end
        Decision.new(true, move, target)
      end

      private

      def target_for(own, siblings)
        siblings.reject { |s| s.hold || s.stopping || s.util >= SATURATED || s.busy >= own.busy }.min_by(&:busy)
      end
    end
  end
end
