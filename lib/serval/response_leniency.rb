# frozen_string_literal: true

module Serval
  # What Serval writes although Rack forbids it, because Puma writes it and
  # apps rely on that (a Rails app setting a header from an unset ENV
  # variable sends nil): a header value that is not a String is written as
  # its to_s (nil: an empty value), a Symbol header name as its String
  # (ext/serval/request.c sv_write_head). In development each header name is warned about
  # once per process, so the app can be fixed; other environments stay quiet.
  # See docs/configuration.md "What Serval accepts in a response".
  #
  # Also the one-time explanation for the responses Serval refuses where Puma
  # writes something (ErrorResponder): a 500 that Puma would not give is
  # explained once per cause, every occurrence is still logged.
  module ResponseLeniency
    EXPLAINED_MAX = 256
    @mutex = Mutex.new
    @warned = {}
    @explained = {}
    @log_writer = nil

    class << self
      # The log writer of the latest ErrorResponder (one per server).
      attr_accessor :log_writer

      # Called by sv_write_head for each lenient conversion; warns once per name.
      def note(name, value)
        return if @warned.key?(name) || !development?

        first = @mutex.synchronize { @warned.key?(name) ? false : (@warned[name.dup.freeze] = true) }
        return unless first

        log("serval: #{what(name, value)}, written as Puma writes it: #{written(name, value)} " \
            "(Rack requires Strings; warned once per header name, in development only)")
      rescue StandardError
        nil # a warning must never turn a response into an error
      end

      # Whether a BadResponse is the first of its cause (its message) in this
      # process: ErrorResponder then adds why Serval refuses it. Bounded: past
      # EXPLAINED_MAX causes, none is new.
      def first_of_cause?(error)
        cause = error.message
        @mutex.synchronize do
          next false if @explained.key?(cause) || @explained.size >= EXPLAINED_MAX

          @explained[cause.dup.freeze] = true
        end
      end

      def development?
        (ENV["RACK_ENV"] || ENV["APP_ENV"] || ENV["RAILS_ENV"] || "development") == "development"
      end

      private

      def what(name, value)
        return "response header name #{name.inspect} is a Symbol" if name.is_a?(Symbol)

        "response header #{name.inspect} has #{value.inspect[0, 40]} (#{value.class}), not a String"
      end

      def written(name, value)
        return "as #{name.to_s.inspect}" if name.is_a?(Symbol)
        return "left out (Serval frames the body itself)" if value.nil? && name.to_s.casecmp?("content-length")

        value.nil? ? "an empty value" : value.to_s.inspect[0, 40]
      end

      def log(message)
        if @log_writer
          @log_writer.warn(message)
        else
          $stderr.puts(message)
        end
      end
    end
  end
end
