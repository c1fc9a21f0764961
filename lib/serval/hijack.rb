# frozen_string_literal: true

require "socket"

module Serval
  # env["rack.hijack"] for one request (full hijack), and its early hints.
  class Hijack
    def self.socket_for(fd)
      io = BasicSocket.for_fd(fd)
      io.autoclose = true
      io.sync = true
      io
    end

    def initialize(request, env)
      @request = request
      @env = env
      @io = nil
    end

    # Full hijack: the socket leaves the server; the application owns it.
    def call
      @io ||= self.class.socket_for(@request.hijack)
      @env["rack.hijack_io"] = @io
    end

    def full?
      !@io.nil?
    end

    def early_hints(headers)
      @request.early_hints(headers)
    rescue ConnectionError
      nil
    end
  end
end
