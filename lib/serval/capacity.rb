# frozen_string_literal: true

module Serval
  # What the master tells load balancers (AgentCheck for HAProxy, GET /ready
  # on the metrics listener for Kubernetes): whether this instance should get
  # new requests, and how much more it can take.
  #
  #   state    :booting   no worker serves yet (or the process itself boots)
  #            :stopping  a graceful stop or hot restart drains the workers
  #            :shedding  a worker answered 503 to requests over max_queue_time
  #                       within the last window (load shedding)
  #            :ready     serving, with the headroom below
  #   headroom 0..1, the mean over serving workers of the smaller of GVL
  #            headroom (1 - share of the last window the GVL was held) and
  #            free threads (1 - busy / max_threads): a process whose threads
  #            all wait on I/O is as full as one whose GVL is saturated
  #   weight   the headroom as a percentage of the configured weight,
  #            MIN_WEIGHT..100 (0 would be HAProxy's DRAIN: a busy instance
  #            keeps a share while the others take more)
  class Capacity
    STATES = %i[booting stopping shedding ready].freeze
    MIN_WEIGHT = 1

    attr_reader :state, :headroom, :workers

    # One process's headroom, 0..1.
    def self.headroom(util, busy, max_threads)
      threads = max_threads.to_i.positive? ? (max_threads - busy) / max_threads.to_f : 0.0
      [1.0 - util, threads].min.clamp(0.0, 1.0)
    end

    # One process's load (in cluster mode Cluster::LoadTable::Entry plays it).
    Load = Struct.new(:util, :busy, :max_threads, :shedding) do
      def headroom = Capacity.headroom(util, busy, max_threads)
    end

    # Single mode: the serving process measured on each call, over the last
    # WINDOW seconds of calls (HAProxy asks every agent-inter).
    class Probe
      WINDOW = 1.0

      def initialize
        require "serval/load_meter"
        @meter = LoadMeter.new(WINDOW)
        @mutex = Mutex.new
      end

      def load(server)
        seconds, busy, _connections, shed, max = LoadMeter.server_figures(server)
        util, mean_busy, shed_recent = @mutex.synchronize do
          @meter.add(Process.clock_gettime(Process::CLOCK_MONOTONIC), LoadMeter.gvl_held, busy, shed,
                     request_seconds: seconds)
          @meter.figures
        end
        Load.new(util, mean_busy, max, shed_recent.positive?)
      end
    end

    # entries: per-process load (Cluster::LoadTable::Entry or anything with
    # #headroom); none yet (the first measurement is a tick away): headroom 1.
    def initialize(state:, entries: [])
      raise ArgumentError, "unknown state #{state.inspect}" unless STATES.include?(state)

      @state = state
      @workers = entries.size
      @headroom = entries.empty? ? 1.0 : entries.sum(&:headroom) / entries.size
    end

    def ready?
      @state == :ready
    end

    def weight
      (@headroom * 100).round.clamp(MIN_WEIGHT, 100)
    end

    # The agent-check answer, one line (HAProxy's configuration manual,
    # "agent-check"): every answer names the states it needs, since HAProxy
    # keeps whatever the agent does not mention and only the agent can undo
    # what it set. "ready" cancels an earlier drain or maint.
    def agent_line
      case @state
      when :ready then "up ready #{weight}%\n"
      when :shedding then "up drain\n"
      when :booting then "down #booting\n"
      when :stopping then "down #stopping\n"
      end
    end

    # [status, body] of GET /ready.
    def readiness
      [ready? ? 200 : 503, "#{@state} headroom=#{format('%.2f', @headroom)} weight=#{weight}%\n"]
    end

    def to_h
      { state: @state, headroom: @headroom.round(3), weight: weight, workers: @workers }
    end
  end
end
