# frozen_string_literal: true

# A model child for tests (Serval::Auto::ModelProcess.new(child: this)):
# lib/serval/auto/model_child.rb, except that a request waits for the test
# first when there is a gate: the window's :gate, or SERVAL_TEST_MODEL_GATE
# (a server process's child), a UNIX socket path. The child connects,
# writes its pid and a newline, and goes on when the test writes a line
# (or closes); a test that never writes makes a child that hangs. No gate,
# or nobody listening there: the child answers at once.
require "socket"
require "serval/advice"
require "serval/auto/model"

module GatedModelChild
  def self.wait(window)
    path = window[:gate] || ENV.fetch("SERVAL_TEST_MODEL_GATE", nil)
    return unless path

    socket = UNIXSocket.new(path)
    socket.write("#{Process.pid}\n")
    socket.gets
    socket.close
  rescue SystemCallError
    nil
  end

  # Serval::Advice.recommend and Serval::Auto::Model.call, gated.
  module Gated
    def recommend(window, **options)
      GatedModelChild.wait(window)
      super
    end

    def call(window, **options)
      GatedModelChild.wait(window)
      super
    end
  end
end
Serval::Advice.singleton_class.prepend(GatedModelChild::Gated)
Serval::Auto::Model.singleton_class.prepend(GatedModelChild::Gated)
load File.expand_path("../../lib/serval/auto/model_child.rb", __dir__)
