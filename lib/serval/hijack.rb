# frozen_string_literal: true

require "socket"

module Serval
  # Full hijack: env["rack.hijack"] is the Native::Request itself, whose
  # #call (ext/serval/request.c) detaches the socket and wraps it here.
  module Hijack
    def self.socket_for(fd)
      io = BasicSocket.for_fd(fd)
      io.autoclose = true
      io.sync = true
      io
    end
  end

  # env["rack.early_hints"] (early_hints on): sends a 103 at once; a client
  # that went away is no error of the app's.
  class EarlyHints
    def initialize(request)
      @request = request
    end

    def call(headers)
      @request.early_hints(headers)
    rescue ConnectionError
      nil
    end
  end
end
