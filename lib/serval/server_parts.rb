# frozen_string_literal: true

module Serval
  # A Server's optional parts, attached through one interface (docs/DESIGN.md
  # "Parts"). Each is off unless its option is set; only then is its file
  # required and the part attached:
  #
  #   Klass.attach(server, options, log_writer) -> the part
  #   part.start   once the core runs, before the thread pool's threads start
  #   part.stop    at stop_at: :drain (as the server starts to drain, before
  #                the pool stops: parts that resize the pool) or :stopped
  #                (once it has stopped: parts that watch requests to the end)
  #   part.stats   a Hash merged into Server#stats (under stats_key if given)
  #
  # A part reaches the server only through its public readers (core,
  # thread_pool, handler) and ThreadPool#add_hook; Server names no part.
  module ServerParts
    Spec = Struct.new(:name, :enabled, :path, :const, :stop_at, :stats_key, keyword_init: true)

    LIST = [
      Spec.new(name: :timing, enabled: ->(o) { o.fetch(:timing, true) }, path: "serval/timing", const: "Timing::Part",
               stop_at: :stopped),
      Spec.new(name: :fairness, enabled: ->(o) { o.fetch(:fair_timeslice, 0).to_f.positive? }, path: "serval/fairness",
               const: "Fairness::Part", stop_at: :stopped),
      Spec.new(name: :oob_gc, enabled: ->(o) { o[:oob_gc] }, path: "serval/oob_gc", const: "OobGc",
               stop_at: :stopped),
      Spec.new(name: :request_timeout, enabled: ->(o) { o[:request_timeout].to_f.positive? },
               path: "serval/request_timeout", const: "RequestTimeoutWatchdog", stop_at: :stopped),
      Spec.new(name: :threads_auto, enabled: ->(o) { o[:threads_auto] }, path: "serval/auto/tuner",
               const: "Auto::Tuner", stop_at: :drain, stats_key: :auto),
      Spec.new(name: :io_lane, enabled: ->(o) { o[:max_io_threads].to_i.positive? }, path: "serval/auto/io_lane",
               const: "Auto::IoLane", stop_at: :drain, stats_key: :io_lane)
    ].freeze

    # The parts options turn on, attached to server: [[Spec, part], ...].
    def self.attach(server, options, log_writer)
      LIST.select { |spec| spec.enabled.call(options) }.map do |spec|
        require spec.path
        [spec, Serval.const_get(spec.const).attach(server, options, log_writer)]
      end
    end
  end
end
