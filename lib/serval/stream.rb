# frozen_string_literal: true

module Serval
  # The stream handed to a Rack 3 streaming body (one that responds to #call).
  # Writes go through the native core (chunked on HTTP/1.1), each sent to the
  # socket when it is made; reads come from
  # the request body. The response ends when the body's #call returns.
  class Stream
    # head: called once, before the first byte goes out (the first write or
    # flush, or #start after the body returned), so a body that raises
    # before writing anything can still be answered with a 500.
    def initialize(request, input, &head)
      @request = request
      @input = input
      @head = head
      @closed = false
    end

    def write(chunk)
      raise IOError, "stream closed" if @closed

      start
      data = chunk.to_s
      @request.stream_write(data)
      data.bytesize
    end

    def start
      return unless @head

      head = @head
      @head = nil
      head.call
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
      return self if @closed

      start
      @request.flush
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
