# frozen_string_literal: true

require "stringio"

module Serval
  # rack.input of a request without a body: one shared, stateless object
  # instead of a StringIO per request. It reads like an empty binary IO at
  # its end (read -> "", read(n) -> nil, read(0) -> "", gets -> nil) and
  # holds no position or closed state, so what one request does to it
  # (rewind, close) is invisible to the next.
  module EmptyInput
    module_function

    def read(length = nil, buffer = nil)
      buffer&.clear
      return nil if length&.positive?

      buffer || String.new(encoding: Encoding::BINARY)
    end

    def readpartial(_length, buffer = nil)
      buffer&.clear
      raise EOFError, "end of file reached"
    end

    def gets(*)
      nil
    end

    def each(*)
      self
    end

    def rewind
      0
    end

    def pos
      0
    end

    def size
      0
    end

    def eof?
      true
    end

    def close; end

    def closed?
      false
    end

    def external_encoding
      Encoding::BINARY
    end

    def binmode?
      true
    end

    # Anything else StringIO answers (string, binmode, each_line, getc,
    # seek, tell, ...) behaves as it did when this was a read-only StringIO
    # over an empty string: rare calls, each on a fresh one.
    EMPTY = "".b.freeze
    private_constant :EMPTY

    def method_missing(name, *args, **kwargs, &block)
      return super unless StringIO.public_method_defined?(name)

      StringIO.new(EMPTY).public_send(name, *args, **kwargs, &block)
    end

    def respond_to_missing?(name, include_private = false)
      StringIO.public_method_defined?(name) || super
    end
  end
end
