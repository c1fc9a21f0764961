# frozen_string_literal: true

require "serval/response_leniency"

module Serval
  # Answers an application error with a 500 (or what lowlevel_error_handler
  # returns) when nothing of the response has been sent yet; otherwise the
  # connection is closed, since a half-sent response cannot be repaired.
  #
  # A BadResponse (what the app returned cannot go on the wire, or would
  # split the response: ext/serval/request.c) is logged as one line naming the
  # cause (its backtrace is Serval's own); the first of each cause says why.
  class ErrorResponder
    DEFAULT = [500, { "content-type" => "text/plain" }.freeze, ["Internal Server Error\n"].freeze].freeze
    REFUSED = "Serval refuses to send this (Puma may write it, dropping or mangling part of it); " \
              "see docs/configuration.md \"What Serval accepts in a response\""

    def initialize(handler, log_writer)
      @handler = handler
      @log_writer = log_writer
      ResponseLeniency.log_writer = log_writer # its development warnings go where ours go
    end

    def respond(request, env, error)
      log(error, "#{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
      if request.head_written?
        request.abort # part of the response may be out: close rather than mix
        return [nil, nil]
      end

      status, headers, body = response_for(error, env)
      length = body.sum(&:bytesize)
      if request.write_head(status, headers, length)
        body.each { |chunk| request.write(chunk) }
      end
      [status, headers]
    rescue StandardError => e
      @log_writer.exception(e, "error response failed")
      request.abort
      [nil, nil]
    end

    private

    def log(error, context)
      return @log_writer.exception(error, context) unless error.is_a?(BadResponse)

      line = "#{utf8(context)}: #{error.class}: #{utf8(error.message)}"
      line += " (#{REFUSED})" if ResponseLeniency.first_of_cause?(error)
      @log_writer.error(line)
    end

    # Client bytes (the path) and app bytes (a header name) in one line.
    def utf8(text)
      text.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")
    end

    def response_for(error, env)
      return DEFAULT unless @handler

      triple = case @handler.arity
               when 1 then @handler.call(error)
               when 2 then @handler.call(error, env)
               else @handler.call(error, env, 500)
               end
      status, headers, body = triple
      chunks = []
      body.each { |c| chunks << c.to_s }
      body.close if body.respond_to?(:close)
      [status, headers || {}, chunks]
    rescue StandardError => e
      @log_writer.exception(e, "lowlevel_error_handler raised")
      DEFAULT
    end
  end
end
