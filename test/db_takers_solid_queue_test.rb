# frozen_string_literal: true

require_relative "test_helper"
require "json"
require "open3"
require "rbconfig"

# Solid Queue in the server (`plugin :solid_queue` or SOLID_QUEUE_IN_PUMA,
# with `solid_queue_mode :async`): its workers' and dispatchers' threads
# take connections from the same pools as the request threads, and the one
# warning line names them beside Action Cable's workers. Forked Solid Queue
# processes (the default mode) have pools of their own and do not count.
# Each case runs in a child Ruby with stand-ins for Solid Queue and Action
# Cable (neither is in the Gemfile) and the bundled Active Record, so this
# process never loads them.
class DbTakersSolidQueueTest < Minitest::Test
  SCRIPT = <<~'RUBY'
    require "json"
    require "active_record"
    require "serval/db_pools"
    module SolidQueue
      Process = Struct.new(:kind, :attributes)
      class Configuration
        def configured_processes
          [Process.new(:worker, { threads: 3 }), Process.new(:worker, { threads: 2 }), Process.new(:dispatcher, {})]
        end
      end
    end
    module ActionCable
      module Server
        class Base; end
      end
      def self.server = Struct.new(:config).new(Struct.new(:worker_pool_size).new(4))
    end
    lines = []
    log = Object.new
    log.define_singleton_method(:warn) { |m| lines << m }
    options = JSON.parse(ARGV[0], symbolize_names: true)
    options[:puma_plugins] = options[:puma_plugins].map { |name| [name, Object.new] }
    options[:plugin_options]&.transform_values!(&:to_sym)
    ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: ":memory:", pool: 5)
    Serval::DbPools.after_boot(options, log)
    Serval::DbPools.attach
    Serval::DbPools.stats # reads the pools again: no second line
    puts JSON.generate(takers: Serval::DbPools.other_takers, lines: lines)
  RUBY

  def takers(options, env = {})
    out, err, status = Open3.capture3(env, RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", SCRIPT,
                                      JSON.generate(options))
    skip "Active Record with sqlite3 is not in the bundle" if err.include?("cannot load such file -- active_record")
    assert status.success?, err
    JSON.parse(out, symbolize_names: true)
  end

  BASE = { max_threads: 3, sources: { max_threads: "config/serval.rb" }, puma_plugins: ["solid_queue"] }.freeze

  def test_async_solid_queue_threads_count_and_one_line_names_every_taker
    got = takers(BASE.merge(plugin_options: { solid_queue_mode: "async" }))
    # 1 supervisor heartbeat + (3 + 1) + (2 + 1) worker threads and pollers + 1 dispatcher
    assert_equal [{ name: "Action Cable workers", threads: 4, source: "config.action_cable.worker_pool_size" },
                  { name: "Solid Queue threads", threads: 9, source: "config/queue.yml, solid_queue_mode :async" }],
                 got[:takers]
    assert_equal 1, got[:lines].size, got[:lines].inspect
    assert_match(/\AWARNING: max_threads 3 \(config\/serval\.rb\) \+ 4 Action Cable workers \([^)]+\) \+ 9 Solid Queue threads \([^)]+\) = 16 threads take database connections in pid \d+, above the size of database pool "primary": 5 .* raise the pool to 16 /,
                 got[:lines].first)
  end

  def test_solid_queue_in_puma_env_counts_like_the_plugin
    got = takers(BASE.merge(puma_plugins: [], plugin_options: { solid_queue_mode: "async" }), "SOLID_QUEUE_IN_PUMA" => "1")
    assert_equal 9, got[:takers].find { |t| t[:name] == "Solid Queue threads" }&.dig(:threads)
  end

  def test_forked_solid_queue_and_no_plugin_do_not_count
    [BASE, BASE.merge(plugin_options: { solid_queue_mode: "fork" }),
     BASE.merge(puma_plugins: [], plugin_options: { solid_queue_mode: "async" })].each do |options|
      got = takers(options, "SOLID_QUEUE_IN_PUMA" => nil)
      assert_equal ["Action Cable workers"], got[:takers].map { |t| t[:name] }, options.inspect
      assert_equal 1, got[:lines].size
      assert_match(/= 7 threads take database connections/, got[:lines].first)
    end
  end
end
