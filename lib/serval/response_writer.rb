# frozen_string_literal: true

require "serval/stream"

module Serval
  # Writes a Rack response through a native Request: Array bodies with a
  # content-length, to_path bodies with sendfile, other enumerables with a
  # content-length buffered like an Array (the thread never waits for the
  # client: see #write_each), enumerables without one (and Rails'
  # ActionController::Live bodies) streamed chunked (HTTP/1.1) or until
  # close (HTTP/1.0) with every chunk sent as it is yielded (the head with
  # the first), streaming bodies through a Stream (each write sent at once;
  # the head with the first write or flush), and partial hijack (a
  # rack.hijack response header). A plain Array body of Strings without a
  # rack.hijack header never comes here: the handler's Request#respond
  # writes it in one C call.
  class ResponseWriter
    HIJACK = "rack.hijack"
    CONTENT_LENGTH = "content-length"

    def write(request, env, status, headers, body)
      headers ||= {}
      if (hijacker = headers[HIJACK])
        partial_hijack(request, env, status, headers, hijacker)
      elsif body.is_a?(Array)
        write_array(request, status, headers, body)
      elsif body.respond_to?(:to_ary) && (array = body.to_ary).is_a?(Array)
        write_array(request, status, headers, array) # e.g. Rack::Lint's or BodyProxy's wrapper of an Array
      elsif body.respond_to?(:to_path) && (path = sendable(body, headers))
        write_file(request, status, headers, path)
      elsif body.respond_to?(:each)
        write_each(request, status, headers, body)
      elsif body.respond_to?(:call)
        write_stream(request, env, status, headers, body)
      else
        raise BadResponse, "response body responds to neither each nor call"
      end
    end

    private

    # A nil element is left out, as Puma does.
    def write_array(request, status, headers, body)
      length = 0
      body.each { |chunk| length += chunk.bytesize unless chunk.nil? }
      return unless request.write_head(status, headers, length)

      body.each { |chunk| request.write(chunk) unless chunk.nil? }
    end

    # An enumerable whose length the app declared (a content-length header:
    # Rack::Files' range bodies, a CSV export or a proxied download that
    # sets it) is a generated body like an Array: each chunk is buffered,
    # offered to the socket once without waiting (a client that keeps up
    # gets it as it is made), and what the client has not taken stays in the
    # output buffer, then the spill, for the event loop to send while the
    # thread takes the next request (docs/configuration.md "Response
    # bodies"). The declared length frames the response, as for an Array
    # with a wrong content-length (ext/serval/request.c): bytes past it are
    # not sent and the body is not iterated further, and a body that ends
    # short leaves the client waiting for nothing more; either way the
    # connection is closed after the response instead of kept alive.
    #
    # An enumerable of unknown length is streamed: every chunk reaches the
    # socket when the body yields it (Server-Sent Events, ActionController::
    # Live), not when the output buffer fills; when the client is behind,
    # the thread waits for it. Rails' Live bodies are streamed even with a
    # content-length (Rails removes it on the first write anyway).
    #
    # Either way the head goes out with the first chunk, so a body that
    # raises before yielding anything still gets a 500 (Rails' Live returns
    # from #call only once its first write committed the response, so its
    # head is not delayed).
    def write_each(request, status, headers, body)
      declared = declared_length(headers)
      return stream_each(request, status, headers, body) if declared.nil? || live?(body)

      started = false
      sent = 0
      body.each do |chunk|
        next if chunk.nil? # skipped, as Puma does

        unless started
          return unless request.write_head(status, headers, nil) # HEAD, 204, 304: no body to take

          started = true
        end
        request.write_nowait(chunk) # raises unless a String (or to_str), as #stream_write
        sent += chunk.is_a?(String) ? chunk.bytesize : chunk.to_str.bytesize
        break if declared.is_a?(Integer) && sent > declared # cut (and closed) by the C side
      end
      request.write_head(status, headers, nil) unless started
    end

    def stream_each(request, status, headers, body)
      started = false
      body.each do |chunk|
        next if chunk.nil? # skipped, as Puma does

        unless started
          return unless request.write_head(status, headers, nil) # HEAD, 204, 304: no body to take

          started = true
        end
        request.stream_write(chunk)
      end
      request.write_head(status, headers, nil) unless started
    end

    # The content-length header's value as an Integer; true when there is
    # one that is not plain digits (write_head rejects it: a 500 before
    # anything is sent); nil when there is none (or it is nil, which
    # sv_write_head treats as absent). Any case of the name, as sv_write_head
    # reads it.
    def declared_length(headers)
      return nil unless headers.is_a?(Hash) # converted (or refused) by write_head; streamed as before

      value = headers[CONTENT_LENGTH]
      if value.nil? && !headers.key?(CONTENT_LENGTH)
        headers.each do |name, v|
          next unless (name.is_a?(String) || name.is_a?(Symbol)) && name.to_s.casecmp?(CONTENT_LENGTH)

          value = v
          break
        end
      end
      return nil if value.nil?

      value = value.first if value.is_a?(Array) && value.size == 1
      value.to_s.match?(/\A\d{1,18}\z/) ? value.to_s.to_i : true
    end

    # Rails' ActionController::Live: the body (a Rack::BodyProxy passes the
    # call on) is the response's RackBody, whose stream is a Live::Buffer.
    def live?(body)
      return false unless defined?(::ActionController::Live::Buffer) && body.respond_to?(:response)

      response = body.response
      response.respond_to?(:stream) && response.stream.is_a?(::ActionController::Live::Buffer)
    rescue StandardError
      false
    end

    # The file may be sent with sendfile when it is a regular file and the
    # application did not declare a different length (a Range response).
    # to_path may return a Pathname (Rails' send_file(Rails.root.join(...))).
    def sendable(body, headers)
      path = file_path(body.to_path)
      return nil unless path && File.file?(path)

      declared = headers[CONTENT_LENGTH]
      return nil if declared && declared.to_s != File.size(path).to_s

      path
    end

    def file_path(value)
      value.is_a?(String) ? value : File.path(value)
    rescue TypeError
      nil
    end

    def write_file(request, status, headers, path)
      File.open(path, "rb") do |file|
        size = file.size
        request.sendfile(file.fileno, 0, size) if request.write_head(status, headers, size)
      end
    end

    def write_stream(request, env, status, headers, body)
      stream = Stream.new(request, env["rack.input"]) { request.write_head(status, headers, nil) }
      body.call(stream)
      stream.start # nothing was written: the head alone
    end

    def partial_hijack(request, env, status, headers, hijacker)
      headers = headers.reject { |k, _| k == HIJACK }
      request.write_head(status, headers, nil, true)
      io = Hijack.socket_for(request.hijack)
      env["rack.hijack_io"] = io
      hijacker.call(io)
    end
  end
end
