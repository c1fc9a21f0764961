# frozen_string_literal: true

module Serval
  # Answers an application error with a 500 (or what lowlevel_error_handler
  # returns) when nothing of the response has been sent yet; otherwise the
  # connection is closed, since a half-sent response cannot be repaired.
  class ErrorResponder
    DEFAULT = [500, { "content-type" => "text/plain" }.freeze, ["Internal Server Error\n"].freeze].freeze

    def initialize(handler, log_writer)
      @handler = handler
      @log_writer = log_writer
    end

    def respond(request, env, error)
      @log_writer.exception(error, "#{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
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
