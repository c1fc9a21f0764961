# frozen_string_literal: true

require "serval/ticker"

module Serval
  # The advice log line: every `advice_log_interval` seconds (0: never) the
  # process that supervises (the master in cluster mode, which serves no
  # requests; the one process in single mode) reads the launcher's
  # measurement window, computes the advice (Serval::Advice) and logs
  #
  #   advice: 3 threads x 2 processes (cpu share 0.41 from 12,400 requests; running 5 threads, stall p95 38 ms)
  #
  # when advice first becomes available and whenever the decision (threads
  # or processes) changes. The check simulates fewer requests than
  # `servalctl advise` (CHECK_SETTINGS) to keep its CPU cost small: in
  # single mode it shares the GVL with the requests (docs/tuning.md).
  class AdviceLog
    CHECK_SETTINGS = { sim_requests: 5000, load_requests: 5000 }.freeze
    BOOT_WAIT = 86_400

    def self.wanted?(launcher)
      launcher.options.fetch(:advice_log_interval, 0).to_f.positive? && launcher.respond_to?(:window)
    end

    def self.after_boot(launcher)
      new(launcher, interval: launcher.options[:advice_log_interval], log_writer: launcher.log_writer).start
    end

    attr_reader :last

    def initialize(launcher, interval:, log_writer:, settings: CHECK_SETTINGS)
      @launcher = launcher
      @interval = Float(interval)
      @log_writer = log_writer
      @settings = settings
      @last = nil # [threads, processes] last logged
      @last_error = nil
    end

    # One check: logs and returns the line when the decision is new, else nil.
    def check
      window = @launcher.window or return nil
      require "serval/advice/local"
      advice = Advice::Local.recommend(window, stats: @launcher.stats, **@settings)
      return nil unless advice[:enough_data]

      decision = advice.values_at(:threads, :processes)
      return nil if decision == @last

      @last = decision
      @log_writer.info(advice[:summary])
      advice[:summary]
    rescue StandardError => e
      message = "serval: advice failed (#{e.class}: #{e.message})"
      @log_writer.error(message) unless message == @last_error # once per distinct failure
      @last_error = message
      nil
    end

    # priority -3: shorter time slices while it holds the GVL beside request threads
    def start
      @ticker = Ticker.new("serval-advice", @interval, @log_writer, priority: -3,
                           ready: -> { @launcher.wait_until_booted(BOOT_WAIT) }).start { check }
      self
    end

    def stop
      @ticker&.stop
    end
  end
end
