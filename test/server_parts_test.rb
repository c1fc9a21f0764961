# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "timeout"
require "rbconfig"
require "serval/server_parts"

# The optional parts attach through ServerParts: a server with none of their
# options serves without loading their files, and each option attaches its
# part (its stats appear, its file is loaded).
class ServerPartsTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  # In a fresh Ruby: a Server with every part off serves a request; prints
  # the loaded part files, one per line.
  SCRIPT = <<~'RUBY'
    require "serval/configuration"
    require "serval/server"
    require "serval/log_writer"
    require "socket"
    options = Serval::Configuration::DEFAULTS.merge(timing: false, fair_timeslice: 0.0, max_threads: 1).merge(EXTRA)
    log = Serval::LogWriter.new(stdout: $stderr, stderr: $stderr)
    server = Serval::Server.new(->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }, options, log_writer: log)
    listener = TCPServer.new("127.0.0.1", 0)
    server.listen(listener)
    server.run
    client = TCPSocket.new("127.0.0.1", listener.local_address.ip_port)
    client.write("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    abort "no 200" unless client.read.start_with?("HTTP/1.1 200")
    puts server.stats.keys.join(",")
    server.stop(2)
    puts $LOADED_FEATURES.grep(%r{serval/(timing|auto/|oob_gc|gvl_trace)})
  RUBY

  def run_script(extra)
    out, err, status = ::Timeout.timeout(15) do
      Open3.capture3(RbConfig.ruby, "-I", LIB, "-e", "EXTRA = #{extra.inspect}\n#{SCRIPT}")
    end
    assert status.success?, err
    keys, *loaded = out.lines.map(&:chomp)
    [keys.split(",").map(&:to_sym), loaded]
  end

  def test_with_every_part_off_none_is_loaded
    keys, loaded = run_script({})
    assert_empty loaded, "part files loaded with every part off"
    refute_includes keys, :timing
    refute_includes keys, :auto
  end

  def test_each_option_attaches_its_part
    keys, loaded = run_script({ timing: true, oob_gc: 5, max_io_threads: 2 })
    assert(loaded.any? { |f| f.end_with?("serval/timing.rb") }, loaded.inspect)
    assert(loaded.any? { |f| f.end_with?("serval/oob_gc.rb") }, loaded.inspect)
    assert(loaded.any? { |f| f.end_with?("serval/auto/io_lane.rb") }, loaded.inspect)
    assert_includes keys, :timing
    assert_includes keys, :oob_gc_runs
    assert_includes keys, :io_lane
  end

  def test_the_list_names_existing_files_and_constants
    Serval::ServerParts::LIST.each do |spec|
      require spec.path
      klass = Serval.const_get(spec.const)
      assert_respond_to klass, :attach, spec.name
      assert_includes %i[drain stopped], spec.stop_at
    end
  end
end
