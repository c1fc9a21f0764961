# frozen_string_literal: true

require "fileutils"
require "socket"
require "tmpdir"

# Where test/support/gated_model_child.rb waits: a UNIX socket the test
# listens on. A child that came (#accept) waits until #release.
class ModelGate
  CHILD = File.expand_path("gated_model_child.rb", __dir__)

  attr_reader :path

  # open: false leaves it closed (a child passes at once) until #open.
  def initialize(open: true)
    @dir = Dir.mktmpdir("serval-gate-")
    @path = File.join(@dir, "gate")
    self.open if open
  end

  def open
    @server = UNIXServer.new(@path)
    self
  end

  # The next child that waits: [its socket, its pid].
  def accept(timeout: 60)
    raise "no model child came to the gate in #{timeout} s" unless @server.wait_readable(timeout)

    socket = @server.accept
    raise "the model child wrote no pid in #{timeout} s" unless socket.wait_readable(timeout)

    [socket, Integer(socket.gets)]
  end

  def release(socket)
    socket.write("go\n")
    socket.close
  end

  def close
    @server&.close
    FileUtils.rm_rf(@dir)
  end
end
