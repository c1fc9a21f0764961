# frozen_string_literal: true

# examples/rails (Rails 8.1, PostgreSQL) booted under Serval three ways and
# exercised over real HTTP: see docs/rails.md. Needs Ruby >= 3.2, the app's
# bundle and its database; .ci/rails.sh prepares both and runs this file:
#
#   bash .ci/rails.sh                  # everything, as CI does
#   bundle exec ruby -w -Ilib -Itest test/rails/rails_integration.rb   # after .ci/rails.sh setup
#
# It is deliberately not named *_test.rb: the main suite (test/**/*_test.rb,
# also run on Ruby 3.1 where Rails 8 does not install) does not pick it up.
require "test_helper"
require_relative "support/app_server"
require_relative "support/http_client"
require_relative "support/websocket_client"
require_relative "support/checks"
require_relative "support/solid_queue_checks"

module RailsIntegration
  # One boot mode: a class whose tests share one server, booted by the first
  # test that needs it and stopped when the class has run (logs kept on a
  # failure). A boot failure fails every test of the class with the logs.
  class Mode < Minitest::Test
    class << self
      attr_accessor :failed

      def command = raise(NotImplementedError)
      def env = {}
      def workers = Integer(env.fetch("WEB_CONCURRENCY", "0"))

      def server
        raise "#{name}: the server did not boot (see this class's first failure): #{@boot_error.lines.first}" if @boot_error
        return @server if @server

        begin
          @process = AppServer.new(name.split("::").last, command: command, env: env)
          @server = @process.boot(workers: workers)
        rescue StandardError => e
          @boot_error = e.message
          raise
        end
      end

      def run(*args)
        super
      ensure
        @process&.cleanup(!failed)
        @process = @server = nil
      end
    end

    def server = self.class.server
    def workers = self.class.workers
    def threads = Integer(self.class.env.fetch("RAILS_MAX_THREADS"))
    def db_pool = Integer(self.class.env.fetch("DB_POOL", threads.to_s))
    # Action Cable is mounted in the example app: its worker pool (4 by
    # default) takes connections too (Serval::DbPools.other_takers).
    CABLE_WORKERS = 4
    def expect_pool_warning? = threads + CABLE_WORKERS > db_pool

    def after_teardown
      super
      self.class.failed = true unless passed?
    end
  end

  # `bin/rails server -u serval`: Rails' own command picks the handler;
  # config/puma.rb is read for the rest. Threads == pool: no warning.
  class RailsServerTest < Mode
    include Checks

    def self.command = :rails_server
    def self.env = { "RAILS_MAX_THREADS" => "3" }
  end

  # `bundle exec serval -C config/puma.rb` with more threads than the pool.
  class ServalConfigTest < Mode
    include Checks

    def self.command = :serval_config
    def self.env = { "RAILS_MAX_THREADS" => "5", "DB_POOL" => "3" }
  end

  # The same with WEB_CONCURRENCY=2: cluster mode, two workers, each warning
  # about its pool. BUILD_SHA is set here (x-build has a value); the other
  # modes leave it unset (x-build is nil).
  class WebConcurrencyTest < Mode
    include Checks

    def self.command = :serval_config
    def self.env = { "WEB_CONCURRENCY" => "2", "RAILS_MAX_THREADS" => "3", "DB_POOL" => "2", "BUILD_SHA" => "0123abc" }

    def test_two_workers_booted
      pids = (0..1).map { |i| server.wait_for(/- Worker #{i} \(PID: (\d+)\) booted/)[1] }
      assert_equal 2, pids.uniq.size
    end
  end

  # Solid Queue in the server (SOLID_QUEUE_IN_PUMA=1), each way of starting
  # it: a job enqueued by a request runs in the supervisor's worker, and a
  # TERM to the server stops the supervisor and its forks with it. A pool of
  # 5: Solid Queue's worker (3 threads) wants threads + 2 connections.
  class SolidQueueRailsServerTest < Minitest::Test
    include SolidQueueChecks

    def self.command = :rails_server
    def self.env = { "RAILS_MAX_THREADS" => "3", "DB_POOL" => "5" }
  end

  class SolidQueueServalTest < Minitest::Test
    include SolidQueueChecks

    def self.command = :serval_config
    def self.env = { "RAILS_MAX_THREADS" => "3", "DB_POOL" => "5" }
  end

  # Cluster mode: the plugin runs in the master, beside the two workers.
  class SolidQueueServalClusterTest < Minitest::Test
    include SolidQueueChecks

    def self.command = :serval_config
    def self.env = { "WEB_CONCURRENCY" => "2", "RAILS_MAX_THREADS" => "3", "DB_POOL" => "5" }
  end

  # The same checks under Puma on the same app, when SERVAL_RAILS_PUMA=1:
  # the reference when one of the classes above fails (is it the app or
  # the server?). Not part of CI's leg.
  if ENV["SERVAL_RAILS_PUMA"] == "1"
    class SolidQueuePumaTest < Minitest::Test
      include SolidQueueChecks

      def self.command = :puma_config
      def self.env = { "RAILS_MAX_THREADS" => "3", "DB_POOL" => "5" }
    end

    class SolidQueuePumaClusterTest < Minitest::Test
      include SolidQueueChecks

      def self.command = :puma_config
      def self.env = { "WEB_CONCURRENCY" => "2", "RAILS_MAX_THREADS" => "3", "DB_POOL" => "5" }
    end
  end
end
