# frozen_string_literal: true

require "serval/serval_ext"

module Serval
  # Active Record's connection pools as the server sees them. Loaded only when
  # the app has defined ActiveRecord (Server#watch_db_pools); Serval never
  # requires Active Record, and without it none of this exists: no db_pools in
  # the stats, no pool_wait in the timing.
  #
  # - DbPools.stats: every pool's figures for Server#stats[:db_pools], read
  #   from ConnectionPool#stat on the stats path (the control app's thread,
  #   a worker's check-in), never on a request thread. Pools established
  #   after boot (another database, a shard) show up at the next read.
  # - pool_wait, only with the option db_pool_wait (off by default): Active
  #   Record blocks a checkout in ConnectionPool::Queue#wait_poll (Rails 7.1
  #   to 8.1), reached only when no connection is free. That method is
  #   private and Active Record publishes no event for the wait (no
  #   ActiveSupport::Notifications event around it in 7.1 to 8.1; the public
  #   ConnectionPool#checkout also times connecting and verifying), so
  #   WaitMeter is prepended to it, and only when asked for: it wraps the
  #   wait in Native::PoolWait.enter/leave, which keep the blocked time per
  #   thread in C (ext/serval/gvl.c) for Timing#pool_wait. A checkout that
  #   finds a free connection runs no Serval code at all. A wait_poll whose
  #   signature is not (timeout) is left alone, with a warning.
  # - A warning, once per pool and process, when max_threads is above the
  #   pool's size: the threads beyond it wait for a connection.
  module DbPools
    FIGURES = %i[size connections busy idle waiting dead].freeze
    WAIT_POLL = [[:req, :timeout]].freeze # ConnectionPool::Queue#wait_poll's parameters, 7.1 to 8.1

    # Prepended to ActiveRecord::ConnectionAdapters::ConnectionPool::Queue.
    module WaitMeter
      private

      def wait_poll(timeout)
        Native::PoolWait.enter
        super
      ensure
        Native::PoolWait.leave
      end
    end

    @mutex = Mutex.new
    @attached = false
    @metered = false
    @options = nil
    @log_writer = nil
    @warned = {}
    @warned_pid = nil

    class << self
      # In each serving process once the app is loaded: attaches now if
      # ActiveRecord::Base is loaded, else when it loads (its on_load hook).
      def after_boot(options, log_writer)
        return false unless defined?(::ActiveRecord)

        @mutex.synchronize do
          @options = options
          @log_writer = log_writer
          @warned = {}
          @warned_pid = Process.pid
        end
        if defined?(::ActiveSupport) && ::ActiveSupport.respond_to?(:on_load)
          ::ActiveSupport.on_load(:active_record) { Serval::DbPools.attach }
        elsif defined?(::ActiveRecord::Base)
          attach
        end
        true
      end

      def attached?
        @attached
      end

      # Starts measuring pool_wait when db_pool_wait is on (once per process
      # tree: the prepend and the flag survive fork) and warns about pools
      # smaller than max_threads.
      def attach
        @mutex.synchronize do
          if !@metered && @options&.[](:db_pool_wait)
            meter
            @metered = true
          end
          @attached = true
        end
        list = pools
        warn_undersized(list, names_of(list))
      end

      # [{name:, size:, connections:, busy:, idle:, waiting:, dead:}, ...];
      # nil until attached. size is nil for a pool without a limit (8.1).
      def stats
        return nil unless @attached

        list = pools
        names = names_of(list)
        warn_undersized(list, names)
        list.each_with_index.filter_map { |pool, i| row(pool, names[i]) }
      end

      # "primary", "animals", "primary role=reading", "primary shard=two";
      # a name two pools share gets the connection class appended.
      def names_of(list)
        base = list.map { |pool| label(pool) }
        base.each_with_index.map do |name, i|
          base.count(name) == 1 ? name : "#{name} (#{owner_of(list[i]) || "##{i}"})"
        end
      end

      # Where a pool's size came from, for the warning.
      def size_source(pool)
        config = pool.db_config
        hash = config.respond_to?(:configuration_hash) ? config.configuration_hash : {}
        key = %i[max_connections pool].find { |k| hash.key?(k) }
        key ? "#{config_origin(config, key)} #{key}" : "Active Record default"
      end

      private

      def meter
        queue = ::ActiveRecord::ConnectionAdapters::ConnectionPool::Queue
        problem = wait_poll_problem(queue)
        if problem
          @log_writer&.warn("serval: db_pool_wait: Active Record #{::ActiveRecord.version} #{problem}; " \
                            "pool_wait is not measured")
        else
          queue.prepend(WaitMeter)
          Native::PoolWait.enable
        end
      end

      # nil when ConnectionPool::Queue#wait_poll is what WaitMeter wraps.
      def wait_poll_problem(queue)
        return "has no ConnectionPool::Queue#wait_poll" unless queue.private_method_defined?(:wait_poll) ||
                                                               queue.method_defined?(:wait_poll)

        params = queue.instance_method(:wait_poll).parameters
        "has ConnectionPool::Queue#wait_poll(#{params.map(&:last).join(', ')}), not (timeout)" unless params == WAIT_POLL
      end

      def pools
        handler = ::ActiveRecord::Base.connection_handler
        begin
          handler.connection_pool_list(:all)
        rescue ArgumentError
          handler.connection_pool_list
        end
      end

      def row(pool, name)
        stat = pool.stat
        { name: name }.merge(FIGURES.to_h { |k| [k, stat[k]] })
      rescue StandardError # a pool discarded or disconnected meanwhile
        nil
      end

      # The class that established the pool ("ActiveRecord::Base", "AnimalsRecord").
      def owner_of(pool)
        config = pool.respond_to?(:pool_config) ? pool.pool_config : nil
        if config.respond_to?(:connection_name) then config.connection_name
        elsif config.respond_to?(:connection_descriptor) then config.connection_descriptor&.name
        end
      end

      def label(pool)
        name = pool.db_config.name.to_s
        role = pool.respond_to?(:role) ? pool.role : nil
        writing = ::ActiveRecord.respond_to?(:writing_role) ? ::ActiveRecord.writing_role : :writing
        name += " role=#{role}" if role && role.to_s != writing.to_s
        shard = pool.respond_to?(:shard) ? pool.shard : nil
        name += " shard=#{shard}" if shard && shard.to_s != "default"
        name
      end

      def config_origin(config, key)
        url = ENV.fetch("DATABASE_URL", "")
        return "DATABASE_URL" if config.name.to_s == "primary" && url.match?(/[?&]#{key}=/)
        return "config/database.yml" if rails_database_yml?

        "database config #{config.name.to_s.inspect}"
      end

      def rails_database_yml?
        defined?(::Rails) && ::Rails.respond_to?(:root) && ::Rails.root &&
          File.exist?(File.join(::Rails.root.to_s, "config", "database.yml"))
      end

      # One line per pool and process (a forked worker warns again).
      def warn_undersized(list, names)
        threads, log_writer = @mutex.synchronize { [@options&.[](:max_threads), @log_writer] }
        return unless threads.is_a?(Integer) && log_writer

        list.each_with_index do |pool, i|
          size = pool.size
          next unless size.is_a?(Integer) && threads > size
          next unless first_warning?(names[i])

          log_writer.warn("WARNING: max_threads #{threads} (#{thread_source}) is above the size of database pool " \
                          "#{names[i].inspect}: #{size} (#{size_source(pool)}), pid #{Process.pid}. Threads " \
                          "beyond #{size} wait for a connection (pool_wait), not for I/O: raise the pool to " \
                          "#{threads} or lower max_threads")
        end
      rescue StandardError => e
        log_writer&.warn("serval: could not compare max_threads with the database pools: #{e.class}: #{e.message}")
      end

      def first_warning?(name)
        @mutex.synchronize do
          if @warned_pid != Process.pid
            @warned = {}
            @warned_pid = Process.pid
          end
          !@warned[name] && (@warned[name] = true)
        end
      end

      def thread_source
        sources = @options[:sources]
        (sources.is_a?(Hash) && sources[:max_threads]) || "unknown"
      end
    end
  end
end
