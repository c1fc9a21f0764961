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
  # - A warning, one line per process, when a pool is smaller than the
  #   threads that take its connections: max_threads, Action Cable's
  #   workers, load_async's executor, Solid Queue's threads in the server
  #   (other_takers): the threads beyond it wait for a connection.
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
      # other_threads: the threads beside the request threads that take
      # connections (other_takers), only when there are any.
      def stats
        return nil unless @attached

        list = pools
        names = names_of(list)
        warn_undersized(list, names)
        others = other_takers.sum { |t| t[:threads] }
        list.each_with_index.filter_map do |pool, i|
          n = others + pool_async_threads(pool)
          (r = row(pool, names[i])) && n.positive? ? r.merge(other_threads: n) : r
        end
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

      # Closes every pool's connections (the refork mold, before it forks).
      def disconnect_all
        pools.each(&:disconnect!)
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

      # One line per process (a forked worker warns again) naming every pool
      # smaller than the threads that take its connections and every taker;
      # a pool established later that is also too small gets a line of its own.
      def warn_undersized(list, names)
        threads, log_writer = @mutex.synchronize { [@options&.[](:max_threads), @log_writer] }
        return unless threads.is_a?(Integer) && log_writer

        others = other_takers
        short = list.each_with_index.filter_map do |pool, i|
          size = pool.size
          need = threads + others.sum { |t| t[:threads] } + pool_async_threads(pool)
          next unless size.is_a?(Integer) && need > size && first_warning?(names[i])

          [names[i], size, size_source(pool), need, pool_async_threads(pool)]
        end
        return if short.empty?

        log_writer.warn(undersized_line(threads, others, short))
      rescue StandardError => e
        log_writer&.warn("serval: could not compare max_threads with the database pools: #{e.class}: #{e.message}")
      end

      # "WARNING: max_threads 5 (config/serval.rb) + 4 Action Cable workers
      # (config.action_cable.worker_pool_size) = 9 threads take database
      # connections in pid 12, above the size of database pool "primary": 5
      # (config/database.yml max_connections). ..."
      def undersized_line(threads, others, short)
        need = short.map { |row| row[3] }.max
        async = short.map { |row| row[4] }.max
        who = others.map { |t| "#{t[:threads]} #{t[:name]} (#{t[:source]})" }
        who << "#{async} load_async threads (database config max_threads)" if async.positive?
        pools = short.map { |name, size, source, _, _| "#{name.inspect}: #{size} (#{source})" }
        sum = who.empty? ? "" : " + #{who.join(' + ')} = #{need} threads take database connections"
        "WARNING: max_threads #{threads} (#{thread_source})#{sum} in pid #{Process.pid}, above the size of " \
          "database pool#{'s' if pools.size > 1} #{pools.join(', ')}. Threads beyond the pool wait for a " \
          "connection (pool_wait), not for I/O: raise the pool to #{need} or run fewer threads"
      end

      public

      # Threads of this process beside the request threads that check out
      # connections from every pool: [{name:, threads:, source:}, ...].
      # - Action Cable's worker pool, when Action Cable is loaded and mounted
      #   in this server (Rails: config.action_cable.mount_path not nil);
      # - load_async's global executor (async_query_executor
      #   :global_thread_pool); :multi_thread_pool is per pool (pool_async_threads);
      # - Solid Queue's workers and dispatchers when they run as threads of
      #   this process (the Puma plugin with solid_queue_mode :async); forked
      #   Solid Queue processes have pools of their own.
      def other_takers
        [action_cable_takers, async_takers, solid_queue_takers].compact
      end

      private

      def action_cable_takers
        return nil unless defined?(::ActionCable::Server::Base) && ::ActionCable.respond_to?(:server)

        if defined?(::Rails) && ::Rails.respond_to?(:application) && ::Rails.application
          cable = ::Rails.application.config.respond_to?(:action_cable) ? ::Rails.application.config.action_cable : nil
          return nil if cable.respond_to?(:mount_path) && cable.mount_path.nil?
        end
        n = Integer(::ActionCable.server.config.worker_pool_size)
        n.positive? ? { name: "Action Cable workers", threads: n, source: "config.action_cable.worker_pool_size" } : nil
      rescue StandardError
        nil
      end

      def async_takers
        return nil unless ::ActiveRecord.respond_to?(:async_query_executor) &&
                          ::ActiveRecord.async_query_executor == :global_thread_pool

        n = Integer(::ActiveRecord.global_executor_concurrency)
        { name: "load_async threads", threads: n, source: "config.active_record.global_executor_concurrency" }
      rescue StandardError
        nil
      end

      # :multi_thread_pool: each pool has its own executor of max_threads.
      def pool_async_threads(pool)
        return 0 unless ::ActiveRecord.respond_to?(:async_query_executor) &&
                        ::ActiveRecord.async_query_executor == :multi_thread_pool

        config = pool.db_config
        config.respond_to?(:max_threads) ? Integer(config.max_threads) : 0
      rescue StandardError
        0
      end

      def solid_queue_takers
        return nil unless defined?(::SolidQueue)

        mode = @options&.dig(:plugin_options, :solid_queue_mode) || @options&.[](:solid_queue_mode)
        return nil unless mode&.to_sym == :async && solid_queue_plugin?

        n = solid_queue_threads
        n&.positive? ? { name: "Solid Queue threads", threads: n, source: "config/queue.yml, solid_queue_mode :async" } : nil
      rescue StandardError
        nil
      end

      def solid_queue_plugin?
        plugins = Array(@options&.[](:puma_plugins)).map { |name, _| name.to_s }
        plugins.include?("solid_queue") || %w[1 true yes].include?(ENV.fetch("SOLID_QUEUE_IN_PUMA", "").downcase)
      end

      # A worker's threads plus its polling thread, one per dispatcher (and
      # the supervisor's heartbeat), from Solid Queue's configuration.
      def solid_queue_threads
        return nil unless defined?(::SolidQueue::Configuration)

        processes = ::SolidQueue::Configuration.new.configured_processes
        1 + processes.sum do |p|
          kind = p.respond_to?(:kind) ? p.kind.to_s : ""
          attrs = p.respond_to?(:attributes) ? p.attributes : {}
          kind == "worker" ? Integer(attrs[:threads] || attrs["threads"] || 3) + 1 : 1
        end
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
