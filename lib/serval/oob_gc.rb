# frozen_string_literal: true

module Serval
  # oob_gc N (docs/configuration.md "Out-of-band GC"): a full GC.start run
  # out of band - by the request thread whose request just ended with no
  # other request in flight or queued (ThreadPool#out_of_band, Puma's
  # out_of_band moment) - once at least N requests were served since the
  # last one. Requests then meet fewer major GCs of their own.
  class OobGc
    attr_reader :runs

    # A Server part (ServerParts): runs first among the out_of_band hooks.
    def self.attach(server, options, _log_writer)
      new(server.core, every: options[:oob_gc]).tap { |gc| server.thread_pool.add_hook(:out_of_band, gc, first: true) }
    end

    def start = self
    def stop = nil
    def stats = { oob_gc_runs: @runs }

    def initialize(core, every:)
      @core = core
      @every = every
      @last = 0
      @runs = 0
    end

    def call
      served = @core.stats[:requests]
      return if served - @last < @every

      @last = served
      GC.start
      @runs += 1
    end
  end
end
