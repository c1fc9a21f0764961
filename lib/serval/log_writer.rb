# frozen_string_literal: true

module Serval
  # Where Serval's own output goes. Each call writes whole lines under one
  # mutex and flushes, so lines from many threads never interleave. Never call
  # it from a trap handler (the launcher's handlers only write to a pipe).
  class LogWriter
    attr_reader :stdout, :stderr

    # Puma's log_formatter: a callable given each line, printing what it
    # returns. Puma's custom_logger: an object whose #write (else #<<) takes
    # the stdout lines (boot, notices, access) in place of stdout.
    attr_accessor :formatter, :custom_logger

    def initialize(stdout: $stdout, stderr: $stderr, quiet: false, verbose: false)
      @stdout = stdout
      @stderr = stderr
      @quiet = quiet
      @verbose = verbose
      @mutex = Mutex.new
    end

    # From the configuration (Launcher): log_formatter, custom_logger.
    def configure(options)
      @formatter = options[:log_formatter] if options[:log_formatter]
      @custom_logger = options[:custom_logger] if options[:custom_logger]
      self
    end

    def quiet?
      @quiet
    end

    def verbose?
      @verbose
    end

    # Boot lines and notices; silenced by --quiet.
    def info(message)
      write(@stdout, message) unless @quiet
    end

    # Detail for operators; only with --verbose.
    def debug(message)
      write(@stdout, message) if @verbose
    end

    def warn(message)
      write(@stderr, message)
    end

    def error(message)
      write(@stderr, message)
    end

    # One access-log line (--log-requests); not silenced by --quiet.
    def access(line)
      write(@stdout, line)
    end

    # Class, message and backtrace of an error, with what we were doing.
    def exception(error, context = nil)
      head = "#{error.class}: #{safe(error.message)}"
      head = "#{safe(context)}: #{head}" if context
      lines = [head]
      lines.concat((error.backtrace || []).map { |frame| "    #{safe(frame)}" })
      write(@stderr, lines.join("\n"))
    end

    private

    # Client bytes (binary) and app messages (UTF-8) mixed in one line must
    # never make logging raise.
    def safe(text)
      text.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")
    end

    def write(io, message)
      text = format(message.to_s)
      text += "\n" unless text.end_with?("\n")
      return log_to(@custom_logger, text) if @custom_logger && io.equal?(@stdout)

      @mutex.synchronize do
        io.write(text)
        io.flush if io.respond_to?(:flush)
      end
    rescue IOError, SystemCallError
      nil # a closed or broken log stream must never take the server down
    end

    # Each line through the formatter; a formatter that raises leaves the line as it was.
    def format(text)
      return text unless @formatter

      text.split("\n").map do |line|
        @formatter.call(line).to_s
      rescue StandardError
        line
      end.join("\n")
    end

    def log_to(logger, text)
      @mutex.synchronize { logger.respond_to?(:write) ? logger.write(text) : logger << text }
    rescue StandardError
      nil
    end
  end
end
