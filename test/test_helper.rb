# frozen_string_literal: true

# Shared by every test file; each file must also run alone:
#   ruby -w -Ilib -Itest test/binder_test.rb
# A lib already on the load path keeps its place: rake test:asan puts the
# ASan build's directory before it, and that build is the one to load.
[File.expand_path("../lib", __dir__), __dir__].reverse_each do |dir|
  $LOAD_PATH.unshift(dir) unless $LOAD_PATH.include?(dir)
end

require "minitest/autorun"
require "socket"
require "stringio"
require "tmpdir"
require "serval/version"
require "serval/errors"
require "serval/configuration"
require "serval/log_writer"
require "support/http_wire"

module Serval
  module TestHelpers
    # A per-test deadline. When it fires, every thread's backtrace is dumped
    # and the test thread gets TestTimeout raised into it; if the test still
    # has not finished after GRACE seconds, the process exits.
    module Timeout
      LIMIT = Float(ENV.fetch("SERVAL_TEST_TIMEOUT", "20"))
      GRACE = 10

      class TestTimeout < StandardError; end

      def self.dump_threads(io = $stderr)
        Thread.list.each do |thread|
          io.puts "--- #{thread.inspect}"
          (thread.backtrace || []).each { |frame| io.puts "    #{frame}" }
        end
      end

      def run
        test_thread = Thread.current
        done = false
        mutex = Mutex.new
        cond = ConditionVariable.new
        watchdog = Thread.new do
          mutex.synchronize do
            fired = wait_until(mutex, cond, LIMIT) { done }
            unless fired
              $stderr.puts "\n#{self.class}##{name}: timed out after #{LIMIT}s; threads:"
              Timeout.dump_threads
              test_thread.raise(TestTimeout, "#{name} exceeded #{LIMIT}s (SERVAL_TEST_TIMEOUT)")
              unless wait_until(mutex, cond, GRACE) { done }
                $stderr.puts "#{name}: still stuck #{GRACE}s later; exiting"
                Timeout.dump_threads
                exit!(2)
              end
            end
          end
        end
        super
      ensure
        mutex.synchronize do
          done = true
          cond.broadcast
        end
        watchdog.join
      end

      private

      def wait_until(mutex, cond, seconds)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
        until yield
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return false if left <= 0

          cond.wait(mutex, left)
        end
        true
      end
    end

    # In-process tier: a Server on 127.0.0.1, port 0, bound before it runs.
    # The app is wrapped in Rack::Lint unless lint: false. Extra keyword
    # options override Configuration::DEFAULTS (not validated, on purpose:
    # tests may want odd limits). Yields (server, port); stops the server after.
    def with_server(app, lint: true, log_writer: nil, stop_timeout: 5, **opts)
      require "rack"
      require "rack/lint"
      require "serval/server"
      options = Serval::Configuration::DEFAULTS.merge(binds: ["tcp://127.0.0.1:0"]).merge(opts).freeze
      log_writer ||= (@server_log_writer = LogWriter.new(stdout: StringIO.new, stderr: StringIO.new))
      listener = TCPServer.new("127.0.0.1", 0)
      server = Serval::Server.new(lint ? Rack::Lint.new(app) : app, options, log_writer: log_writer)
      server.listen(listener)
      server.run
      yield server, listener.local_address.ip_port
    ensure
      begin
        server&.stop(stop_timeout)
      rescue StandardError => e
        $stderr.puts "with_server: stop failed (#{e.class}: #{e.message}); halting"
        server&.halt
      end
      listener&.close
    end

    # Writes bytes to 127.0.0.1:port and reads until the peer closes or
    # read_timeout seconds have passed in total. Returns what was read.
    def raw_request(port, bytes, read_timeout: 5)
      client = HttpWire::Client.new(port, timeout: read_timeout)
      begin
        client.write(bytes)
      rescue Errno::ECONNRESET, Errno::EPIPE
        nil # the answer, if any, is still read below
      end
      client.read_all
    ensure
      client&.close
    end

    # The options a config file with this text gives (no environment
    # variables read); raises Serval::ConfigError as a boot would.
    def config_from(source)
      require "serval/configuration"
      Dir.mktmpdir do |dir|
        file = File.join(dir, "c.rb")
        File.write(file, source)
        Serval::Configuration.load(cli: {}, config_file: file, warn: ->(_) {}, env: {})
      end
    end

    # The captured server log of the last with_server, printed on failure.
    def after_teardown
      super
      return if passed? || @server_log_writer.nil?

      err = @server_log_writer.stderr.string
      $stderr.puts "\n--- server stderr (#{name}):\n#{err}" unless err.empty?
    end
  end
end

require "io/wait"

Minitest::Test.prepend(Serval::TestHelpers::Timeout)
Minitest::Test.include(Serval::TestHelpers)
