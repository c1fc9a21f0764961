# frozen_string_literal: true

require "json"
require "serval/errors"

module Serval
  # `servalctl advise`: the server's recommendation (/advice), or one
  # computed here from a saved window or `servalctl stats --json --window`
  # snapshot (--from FILE); printed as a table (Advice::Table), as one JSON
  # object (--json), and/or written as an HTML report (--html FILE).
  class CtlAdvise
    # The recommender's fleet options: [flag, key, parse, minimum].
    FLEET = [["--machines N", :machines, Integer, "number of machines in the fleet (default 1)"],
             ["--extra-connections N", :extra_connections, Integer, "other database clients (Sidekiq, cron ...)"],
             ["--db-max-connections N", :db_max_connections, Integer, "the database server's max_connections"],
             ["--target-rps R", :target_rps, Float, "plan machines x processes x threads for R req/s"]].freeze

    # A file's content that is neither a window nor a snapshot with one.
    class NoWindow < StandardError; end

    def self.options(parser, into)
      parser.separator("advise options:")
      parser.on("--json", "advise: print one JSON object (stats always prints JSON)") { into[:json] = true }
      parser.on("--from FILE", "advise: from a saved window, `stats --window` snapshot or `advise --json` answer") do |v|
        into[:from] = v
      end
      parser.on("--html FILE", "advise: also write a self-contained HTML report") { |v| into[:html] = v }
      parser.on("--wait SECONDS", Float, "advise: how long to wait for a busy server's model (default 60; " \
                                         "then exit 4)") { |v| into[:wait] = v }
      FLEET.each do |flag, key, type, text|
        parser.on(flag, type, "advise: #{text}") { |v| into[:fleet][key] = v }
      end
    end

    # The window in a file: a window itself (samples or histograms), or a
    # snapshot holding one under "window". Raises NoWindow otherwise.
    def self.window_from(data, file)
      raise NoWindow, "#{file}: not a JSON object" unless data.is_a?(Hash)
      return data if data.key?("samples") || data.key?("histograms")
      return window_from(data["window"], file) if data["window"].is_a?(Hash)

      raise NoWindow, "#{file} holds no measurement window (no samples or histograms#{
        ', it looks like `servalctl stats --json` without --window' if data.key?('started_at')}): save one " \
        "with `servalctl stats --json --window > FILE` from a server that has /window"
    end

    def initialize(opts, stdout:, stderr:)
      @opts = opts
      @stdout = stdout
      @stderr = stderr
    end

    def validate!
      f = @opts[:fleet]
      raise ConfigError, "--machines must be >= 1" if f[:machines] && f[:machines] < 1
      %i[extra_connections db_max_connections].each do |k|
        raise ConfigError, "--#{k.to_s.tr('_', '-')} must be >= 0" if f[k]&.negative?
      end
      raise ConfigError, "--wait must be >= 0" if @opts[:wait] && !(@opts[:wait].finite? && @opts[:wait] >= 0)
      raise ConfigError, "--target-rps must be > 0" if f[:target_rps] && !(f[:target_rps].finite? && f[:target_rps].positive?)
    end

    # From a file: [advice, window]. Machine facts are this machine's. A
    # saved `advise --json` answer is shown as it is (no window).
    def from_file
      path = @opts[:from]
      data = JSON.parse(File.read(path))
      return [data, nil] if data.is_a?(Hash) && data.key?("enough_data") && data.key?("warnings")

      window = self.class.window_from(data, path)
      # the model's loop runs in about half the CPU time with YJIT (3.3+)
      RubyVM::YJIT.enable if defined?(RubyVM::YJIT) && RubyVM::YJIT.respond_to?(:enable) && !RubyVM::YJIT.enabled?
      require "serval/advice/local"
      advice = Advice::Local.recommend(window, in_server: false, **@opts[:fleet])
      advice[:warnings] << "machine facts (CPUs, memory) are those of the machine servalctl ran on"
      [JSON.parse(JSON.generate(advice)), window]
    rescue SystemCallError => e
      raise ConfigError, "--from #{path}: #{e.message}"
    rescue JSON::ParserError => e
      raise ConfigError, "--from #{path}: not JSON (#{e.message.lines.first&.strip})"
    rescue ArgumentError => e
      raise ConfigError, "--from #{path}: #{e.message}"
    end

    # The query string /advice takes.
    def query
      @opts[:fleet].to_h { |k, v| [k.to_s, v.to_s] }
    end

    # Prints / writes; returns the exit status.
    def show(advice, window)
      if @opts[:html]
        require "serval/advice/report"
        File.write(@opts[:html], Advice::Report.new(advice, window: window).html)
      end
      if @opts[:json]
        @stdout.puts(JSON.generate(advice))
      else
        require "serval/advice/table"
        @stdout.print(Advice::Table.render(advice))
        @stdout.puts("\nReport written to #{@opts[:html]}") if @opts[:html]
      end
      0
    rescue SystemCallError => e
      @stderr.puts("servalctl: advise: cannot write #{@opts[:html]} (#{e.message})")
      1
    end
  end
end
