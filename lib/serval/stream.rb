# frozen_string_literal: true

module Serval
  # The stream handed to a Rack 3 streaming body (one that responds to #call).
  # Writes go through the native core (chunked on HTTP/1.1), each sent to the
  # socket when it is made; reads come from
  # the request body. The response ends when the body's #call returns.
  class Stream
    def initialize(request, input)
      @request = request
      @input = input
      @closed = false
    end

    def write(chunk)
      raise IOError, "stream closed" if @closed

      data = chunk.to_s
      @request.stream_write(data)
      data.bytesize
    end

    def <<(chunk)
      write(chunk)
      self
    end

    def read(*args)
      @input.read(*args)
    end

    def read_partial(*args)
      @input.readpartial(*args)
    end

    # Writes are sent as they are made; flush waits until the client's
    # socket has taken everything (bounded by write_timeout).
    def flush
      @request.flush unless @closed
      self
    end

    def close_read
      nil
    end

    def close_write
      @closed = true
      nil
    end

    def close
      @closed = true
      nil
    end

    def closed?
      @closed
    end
  end
end
