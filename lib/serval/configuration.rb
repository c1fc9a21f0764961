# frozen_string_literal: true

require "tmpdir"
require "serval/errors"
require "serval/native_ext"
require "serval/fairness"
require "serval/remote_address"

module Serval
  # Builds the frozen options hash the Server receives, from these layers:
  # DEFAULTS < launcher defaults (rails server's Host/Port) < environment
  # variables (EnvConfig) < config file (DSL) < command line / handler options.
  # Every value is checked here, at boot; a wrong value raises ConfigError
  # whose message starts with the option's name. options[:sources] says, for
  # every key, which layer its value came from ("flag -t", "env
  # WEB_CONCURRENCY", "config file config/puma.rb", "default", ...).
  class Configuration
    # The native core's numeric options, {key => [default, min, max]}: their
    # one source of truth is the table in ext/serval/core.c, so whatever the
    # configuration accepts, Core.new accepts too (also after fork).
    CORE = Native::Core::OPTIONS

    DEFAULTS = {
      binds: ["tcp://0.0.0.0:9292"].freeze,
      min_threads: 0,
      max_threads: 5,             # with threads_auto: the count it starts from
      threads_auto: false,        # threads :auto / -t auto / RAILS_MAX_THREADS=auto (docs/tuning.md)
      threads_auto_max: 16,       # the most threads auto may set (-t auto:MAX)
      threads_auto_min: 0,        # the fewest, given with auto (-t MIN:auto); 0: none given, auto may go to 1
      auto_interval: 5.0,         # seconds between auto's measurements
      max_io_threads: 0,          # the I/O lane: threads above max while requests idle in flight; 0: off
      io_lane_idle: 0.5,          # a request idle this long (and 3/4 of its time) counts for the lane
      environment: "development", # or $APP_ENV, $RACK_ENV, $RAILS_ENV (EnvConfig)
      rackup: "config.ru",
      directory: nil,
      pidfile: nil,
      tag: nil,
      log_requests: false,
      quiet: false,
      verbose: false,
      lowlevel_error_handler: nil,
      early_hints: false,
      timing: true,
      timing_sample_rate: 0.05,
      timing_sample_cap: 1000, # sampled requests a second at most (rate < 1); 0: no cap
      max_request_line: CORE[:max_request_line][0],
      max_head: CORE[:max_head][0],
      max_headers: CORE[:max_headers][0],
      max_body: nil, # no limit, as Puma (docs/configuration.md "Request bodies")
      body_spill: CORE[:body_spill][0],
      max_chunk_ext: CORE[:max_chunk_ext][0],
      first_data_timeout: CORE[:first_data_timeout][0],
      read_timeout: CORE[:read_timeout][0],
      persistent_timeout: CORE[:persistent_timeout][0],
      write_timeout: CORE[:write_timeout][0],
      max_connections: CORE[:max_connections][0],
      output_buffer: CORE[:output_buffer][0],
      output_budget: CORE[:output_budget][0], # docs/configuration.md "Response bodies"
      max_spill: CORE[:max_spill][0],
      max_keepalive_requests: CORE[:max_keepalive_requests][0],
      min_body_rate: CORE[:min_body_rate][0],
      max_queue_time: CORE[:max_queue_time][0], # load shedding off (docs/tuning.md "Load shedding")
      tmpdir: Dir.tmpdir.dup.freeze,
      drain_timeout: 30.0,
      thread_idle_timeout: 30.0,
      backlog: 1024,
      workers: 0,
      preload_app: nil,
      worker_timeout: 60.0,
      worker_boot_timeout: 60.0,
      worker_check_interval: 5.0,
      worker_max_requests: nil,        # recycle a worker after this many requests (cluster; docs/configuration.md)
      worker_max_requests_jitter: 0.1, # each worker's limit is drawn in N..N*(1+jitter)
      worker_max_memory: nil,          # recycle a worker above this many MB of PSS (RSS where PSS is unreadable)
      request_timeout: nil,            # seconds; a request running longer is answered 503/504 (docs/configuration.md)
      request_timeout_raise: false,    # also raise Serval::RequestTimeout in its thread
      request_timeout_grace: 10.0,     # a thread not back this long after: stuck (cluster: worker replaced)
      oob_gc: nil,                     # N: GC.start when idle, once per N requests (true: 1)
      fork_worker: nil,                # refork from a warmed worker after N requests of worker 0 (0: on command only)
      before_fork: [].freeze,
      before_worker_boot: [].freeze,
      after_worker_boot: [].freeze,
      before_worker_shutdown: [].freeze,
      after_worker_shutdown: [].freeze,
      before_worker_fork: [].freeze,
      after_booted: [].freeze,     # Puma's lifecycle hooks (lib/serval/events.rb)
      before_restart: [].freeze,
      after_stopped: [].freeze,
      before_refork: [].freeze,    # in the mold, before and after it forks a worker (fork_worker)
      after_refork: [].freeze,
      before_thread_start: [].freeze, # in each request thread (ThreadPool)
      before_thread_exit: [].freeze,
      out_of_band: [].freeze,         # when a request ends and none is in flight or queued
      activated_sockets_only: false,  # bind_to_activated_sockets 'only' (Binder#bind)
      puma_plugins: [].freeze,        # [name, instance] of each Puma plugin (lib/serval/puma_plugins.rb)
      plugin_options: {}.freeze,      # what plugins' config methods set
      control_url: nil,
      control_auth_token: nil,
      metrics_bind: nil,
      state_path: nil,
      plugins: [].freeze,
      stdout_sync: true,
      sources: {}.freeze,
      error_log_limit: 10,
      advice_log_interval: 60.0, # seconds between advice checks (docs/tuning.md); 0: off
      fair_timeslice: 0.0, # off: Ruby's 100 ms slice; true/ms: a computing request thread keeps the GVL from a waiting one that long (docs/tuning.md)
      db_pool_wait: false, # measure pool_wait: wraps Active Record's private ConnectionPool::Queue#wait_poll (DbPools)
      gvl_balance: true, # cluster: a GVL-bound worker leaves connections to siblings (docs/tuning.md)
      thread_polls: true, # request threads read requests between requests while the loop parks (docs/DESIGN.md)
      gvl_balance_interval: 1.0, # seconds: the load window, and the least time between two moves
      agent_check_url: nil, # tcp://HOST:PORT: HAProxy agent-check on the master (docs/deployment.md)
      remote_address: :socket, # set_remote_address: REMOTE_ADDR's source (lib/serval/remote_address.rb)
      # Puma 8's DSL (docs/configuration.md "Every Puma 8 config method")
      redirect_stdout: nil, redirect_stderr: nil, redirect_append: false, # stdout_redirect
      log_formatter: nil,           # a callable applied to every line LogWriter prints
      custom_logger: nil,           # an object with #write (or #<<) taking LogWriter's stdout lines
      state_permission: nil,        # mode of the state file (default 0600)
      raise_exception_on_sigterm: false, # true: after a TERM stop the process ends by SIGTERM (Puma's default)
      supported_http_methods: nil,  # nil: any method; else a list, others get 501
      worker_culling_strategy: :youngest,
      idle_timeout: nil,            # seconds without a request, then a graceful stop
      fiber_per_request: false,     # each request runs in a new Fiber (clean fiber locals)
      shutdown_debug: false,        # true: dump threads when a stop begins; :on_force: when requests outlive the drain
      restart_command: nil,         # what a hot restart execs instead of this ruby and script
      rack_url_scheme: nil,         # env["rack.url_scheme"] on plain connections (TLS ones say https)
      app: nil,                     # a Rack app given in the config file instead of the rackup file
      silence_single_worker_warning: false, silence_fork_callback_warning: false
    }.freeze

    # Values finish does not freeze: objects the user gave, used as they are.
    UNFROZEN = %i[custom_logger app log_formatter].freeze

    # Cluster hooks => how many arguments their blocks receive.
    HOOKS = { before_fork: 0, before_worker_boot: 1, after_worker_boot: 1,
              before_worker_shutdown: 1, after_worker_shutdown: 1, before_worker_fork: 1,
              after_booted: 0, before_restart: 0, after_stopped: 0, before_refork: 1, after_refork: 1,
              before_thread_start: 0, before_thread_exit: 0, out_of_band: 0 }.freeze

    DAY = 86_400.0
    INT_MAX = 2**31 - 1

    # key => [kind, minimum, maximum]
    RULES = {
      binds: [:binds],
      min_threads: [:int, 0, 4096],
      max_threads: [:int, 1, 4096],
      threads_auto: [:bool],
      threads_auto_max: [:int, 1, 4096],
      threads_auto_min: [:int, 0, 4096],
      auto_interval: [:seconds, 0.05, 3600.0],
      max_io_threads: [:int, 0, 4096],
      io_lane_idle: [:seconds, 0.01, 3600.0],
      environment: [:string],
      rackup: [:string],
      directory: [:string_or_nil],
      pidfile: [:string_or_nil],
      tag: [:string_or_nil],
      log_requests: [:bool],
      quiet: [:bool],
      verbose: [:bool],
      lowlevel_error_handler: [:handler],
      early_hints: [:bool],
      timing: [:bool],
      timing_sample_rate: [:seconds, 0.0, 1.0], # a plain number in 0..1
      timing_sample_cap: [:int, 0, 1_000_000_000],
      max_request_line: [:int, *CORE[:max_request_line][1, 2]],
      max_head: [:int, *CORE[:max_head][1, 2]],
      max_headers: [:int, *CORE[:max_headers][1, 2]],
      max_body: [:int_or_nil, 0, 1 << 62],
      body_spill: [:int, *CORE[:body_spill][1, 2]],
      max_chunk_ext: [:int, *CORE[:max_chunk_ext][1, 2]],
      first_data_timeout: [:seconds, *CORE[:first_data_timeout][1, 2]],
      read_timeout: [:seconds, *CORE[:read_timeout][1, 2]],
      persistent_timeout: [:seconds, *CORE[:persistent_timeout][1, 2]],
      write_timeout: [:seconds, *CORE[:write_timeout][1, 2]],
      max_connections: [:int, *CORE[:max_connections][1, 2]],
      output_buffer: [:int, *CORE[:output_buffer][1, 2]],
      output_budget: [:int, *CORE[:output_budget][1, 2]],
      max_spill: [:int, *CORE[:max_spill][1, 2]],
      max_keepalive_requests: [:int, *CORE[:max_keepalive_requests][1, 2]],
      min_body_rate: [:seconds, *CORE[:min_body_rate][1, 2]], # a plain number: bytes per second
      max_queue_time: [:seconds, *CORE[:max_queue_time][1, 2]],
      tmpdir: [:directory],
      drain_timeout: [:seconds, 0.0, DAY],
      thread_idle_timeout: [:seconds, 0.001, DAY],
      backlog: [:int, 1, 65_535],
      workers: [:workers, 0, 4096],
      preload_app: [:bool_or_nil],
      worker_timeout: [:seconds, 0.5, DAY],
      worker_boot_timeout: [:seconds, 0.5, DAY],
      worker_check_interval: [:seconds, 0.05, 3600.0],
      worker_max_requests: [:int_or_nil, 1, 1 << 62],
      worker_max_requests_jitter: [:seconds, 0.0, 1.0], # a fraction
      worker_max_memory: [:int_or_nil, 1, 1 << 30],
      request_timeout: [:seconds_or_nil, 0.0, DAY], # 0: off, as nil
      request_timeout_raise: [:bool],
      request_timeout_grace: [:seconds, 0.0, DAY],
      oob_gc: [:int_or_nil, 1, 1 << 30],
      fork_worker: [:int_or_nil, 0, 1 << 62],
      before_fork: [:hooks], before_worker_boot: [:hooks], after_worker_boot: [:hooks],
      before_worker_shutdown: [:hooks], after_worker_shutdown: [:hooks],
      before_worker_fork: [:hooks], after_booted: [:hooks], before_restart: [:hooks], after_stopped: [:hooks],
      before_refork: [:hooks], after_refork: [:hooks], before_thread_start: [:hooks], before_thread_exit: [:hooks],
      out_of_band: [:hooks],
      puma_plugins: [:any], plugin_options: [:any], activated_sockets_only: [:bool],
      control_url: [:bind_or_nil],
      control_auth_token: [:string_or_nil],
      metrics_bind: [:bind_or_nil],
      state_path: [:string_or_nil],
      plugins: [:plugins],
      stdout_sync: [:bool],
      sources: [:sources],
      error_log_limit: [:int, 0, 1_000_000],
      advice_log_interval: [:seconds, 0.0, DAY], # 0, or at least ADVICE_LOG_MIN (check_relations)
      fair_timeslice: [:timeslice, 1.0, 100.0], # milliseconds, or 0/false (off)
      db_pool_wait: [:bool],
      gvl_balance: [:bool],
      thread_polls: [:bool],
      gvl_balance_interval: [:seconds, 0.2, 60.0],
      agent_check_url: [:tcp_or_nil],
      remote_address: [:remote_address],
      redirect_stdout: [:string_or_nil], redirect_stderr: [:string_or_nil], redirect_append: [:bool],
      log_formatter: [:callable_or_nil],
      custom_logger: [:logger],
      state_permission: [:int_or_nil, 0, 0o777],
      raise_exception_on_sigterm: [:bool],
      supported_http_methods: [:methods],
      worker_culling_strategy: [:choice, %i[youngest oldest]],
      idle_timeout: [:seconds_or_nil, 0.001, DAY],
      fiber_per_request: [:bool],
      shutdown_debug: [:choice, [false, true, :on_force]],
      restart_command: [:string_or_nil],
      rack_url_scheme: [:string_or_nil],
      app: [:callable_or_nil],
      silence_single_worker_warning: [:bool], silence_fork_callback_warning: [:bool]
    }.freeze

    # The shortest advice_log_interval: each check costs ~0.2 s of Ruby CPU.
    ADVICE_LOG_MIN = 1.0

    # Plugins (`plugin :name`) Serval runs; see lib/serval/plugins.rb.
    PLUGINS = %w[tmp_restart].freeze

    # Default config files, the first that exists is read: Serval's own, then
    # Puma's (what `puma` and Puma's Rack handler read under `rails server`).
    def self.default_files(environment)
      ["config/serval/#{environment}.rb", "config/serval.rb", "config/puma/#{environment}.rb", "config/puma.rb"]
    end

    # Keyword arguments of #initialize; see there.
    def self.load(**kw)
      new(**kw).options
    end

    attr_reader :options, :config_file

    # cli:          options from the command line or handler (already coerced by the DSL)
    # cli_sources:  key => where each cli value came from ("flag -t")
    # config_file:  a path, nil (look for the default files) or "-" (none)
    # warn:         callable receiving warning lines
    # env:          the environment variables to read (EnvConfig)
    # launcher:     options a launcher supplies as defaults (rails server's Host/Port
    #               when the user did not give them), with launcher_sources
    # default_host: the host of the config file's `port N` (else 0.0.0.0)
    def initialize(cli: {}, cli_sources: {}, config_file: nil, warn: ->(msg) { Kernel.warn(msg) }, env: ENV,
                   launcher: {}, launcher_sources: {}, default_host: nil)
      require "serval/dsl"
      require "serval/env_config"
      @warn = warn
      env_options, env_sources = EnvConfig.read(env)
      # RAILS_MAX_THREADS=auto / WEB_CONCURRENCY=auto become numbers before the
      # config file runs: a file that loads the app sees a pool size, not "auto"
      auto_value = EnvConfig.export_auto(env, cli, env_options)
      @config_file = find_file(config_file, cli[:environment] || env_options[:environment] || DEFAULTS[:environment])
      file_options = {}
      file_sources = {}
      if @config_file
        dsl = DSL.new(file_options, warn, sources: file_sources, source: "config file #{@config_file}",
                                          default_host: default_host, auto_value: auto_value).load_file(@config_file)
        # Puma's `single { }` / `cluster { }`: run once every layer's workers is known
        workers = [cli, file_options, env_options].map { |h| h[:workers] }.compact.first || 0
        dsl.run_mode_blocks(self.class.coerce(:workers, workers).positive? ? :cluster : :single)
      end
      sources = (DEFAULTS.keys - [:sources]).to_h { |k| [k, "default"] }
      sources.merge!(launcher_sources, env_sources, file_sources, cli_sources)
      hash = DEFAULTS.merge(launcher, env_options, file_options, cli)
      @options = self.class.finish(hash.merge(sources: sources.slice(*hash.keys)))
    end

    # Validates a merged hash and returns it deeply frozen.
    def self.finish(hash)
      unknown = hash.keys - DEFAULTS.keys
      raise ConfigError, "unknown option `#{unknown.first}`" unless unknown.empty?

      out = hash.to_h { |key, value| [key, coerce(key, value)] }
      settle_auto(out)
      check_relations(out)
      out.each { |k, v| v.freeze unless v.is_a?(Proc) || v.respond_to?(:call) || UNFROZEN.include?(k) }
      out.freeze
    end

    # Where a key's value came from ("unknown" when the hash has no sources).
    def self.source(options, key)
      (options[:sources] || {}).fetch(key, "unknown")
    end

    # threads :auto starts from max_threads (the default 5, RAILS_MAX_THREADS
    # or a config file's count), kept within its floor..threads_auto_max. The
    # floor is a minimum given with auto (`threads 2, :auto`, `-t 2:auto`),
    # else 1: a min_threads that came with a fixed count (`threads 5, 5` in a
    # file that `-t auto` overrides) is not auto's floor, only how many
    # threads start (never more than auto starts at).
    # It measures with the timing figures, so it needs them on.
    def self.settle_auto(opts)
      return unless opts[:threads_auto]

      cap = opts[:threads_auto_max]
      floor = auto_floor(opts)
      if floor > cap
        raise ConfigError, "threads_auto_max: must be >= the minimum given with auto (#{floor}, " \
                           "#{source(opts, :threads_auto_min)}), got #{cap} (#{source(opts, :threads_auto_max)})"
      end
      raise ConfigError, "threads: auto needs timing (it measures with it); remove `timing false`" unless opts[:timing]

      opts[:max_threads] = opts[:max_threads].clamp(floor, cap)
      opts[:min_threads] = [opts[:min_threads], opts[:max_threads]].min
    end

    # The fewest threads auto may set: a minimum given with auto, else 1.
    def self.auto_floor(opts) = [opts.fetch(:threads_auto_min, 0), 1].max

    def self.check_relations(opts)
      RemoteAddress.check(opts)
      if opts[:max_io_threads].positive? && !opts[:timing]
        raise ConfigError, "max_io_threads: the I/O lane measures idle requests with timing; remove `timing false`"
      end
      if opts[:worker_timeout] <= opts[:worker_check_interval]
        raise ConfigError, "worker_timeout (#{opts[:worker_timeout]}) must be > worker_check_interval " \
                           "(#{opts[:worker_check_interval]})"
      end
      if opts[:min_threads] > opts[:max_threads]
        min, max = %i[min_threads max_threads].map { |k| "#{opts[k]}, #{source(opts, k)}" }
        raise ConfigError, "threads: min (#{min}) must be <= max (#{max})"
      end
      if opts[:advice_log_interval].positive? && opts[:advice_log_interval] < ADVICE_LOG_MIN
        raise ConfigError, "advice_log_interval: must be 0 (off) or >= #{ADVICE_LOG_MIN} (got #{opts[:advice_log_interval]})"
      end
      return if opts[:max_request_line] <= opts[:max_head]

      raise ConfigError, "max_request_line (#{opts[:max_request_line]}) must be <= max_head (#{opts[:max_head]})"
    end

    # Converts and checks one value; `name` is what the message calls it.
    def self.coerce(key, value, name: key)
      kind, min, max = RULES.fetch(key)
      case kind
      when :int then range(name, int(name, value), min, max)
      when :int_or_nil then value.nil? ? nil : range(name, int(name, value), min, max)
      when :seconds then range(name, seconds(name, value), min, max)
      when :bool then bool(name, value)
      when :string then string(name, value)
      when :string_or_nil then value.nil? ? nil : string(name, value)
      when :directory then directory(name, value)
      when :handler then handler(name, value)
      when :binds then binds(name, value)
      when :workers then range(name, workers(name, value), min, max)
      when :bool_or_nil then value.nil? ? nil : bool(name, value)
      when :hooks then hooks(name, key, value)
      when :bind_or_nil then value.nil? ? nil : plain_bind(name, value)
      when :tcp_or_nil then value.nil? ? nil : tcp_url(name, value)
      when :plugins then plugins(name, value)
      when :sources then sources(name, value)
      when :any then value
      when :timeslice then Fairness.coerce(name, value, min, max, Fairness::DEFAULT_SLICE_MS)
      when :seconds_or_nil then value.nil? ? nil : range(name, seconds(name, value), min, max)
      when :callable_or_nil then callable(name, value)
      when :logger then logger(name, value)
      when :methods then http_methods(name, value)
      when :choice then choice(name, value, min)
      when :remote_address then RemoteAddress.coerce(name, value)
      end
    end

    def self.callable(name, value)
      return nil if value.nil?
      raise ConfigError, "#{name}: expected a block or a callable, got #{value.inspect}" unless value.respond_to?(:call)

      value
    end

    # Puma's custom_logger: LogWriter's stdout lines go to its #write (a Logger: #<<).
    def self.logger(name, value)
      return nil if value.nil?
      return value if value.respond_to?(:write) || (value.respond_to?(:<<) && value.respond_to?(:info))

      raise ConfigError, "#{name}: expected an object with #write (an IO) or a Logger, got #{value.inspect}"
    end

    # nil (any method), :any, or a non-empty list of distinct method names
    # (upper case letters, digits, - and _, as HTTP tokens go).
    def self.http_methods(name, value)
      return nil if value.nil? || value.to_s == "any"

      list = value.is_a?(Array) ? value.map { |m| m.is_a?(Symbol) ? m.to_s : m } : nil
      unless list && !list.empty? && list.all? { |m| m.is_a?(String) && m.match?(/\A[A-Z0-9!#$%&'*+.^_`|~-]+\z/) } &&
             list.uniq.size == list.size
        raise ConfigError, "#{name}: expected :any or a list of distinct upper-case method names, got #{value.inspect}"
      end

      list.map { |m| m.dup.freeze }.freeze
    end

    def self.choice(name, value, allowed)
      value = value.to_sym if value.is_a?(String)
      return value if allowed.include?(value)

      raise ConfigError, "#{name}: expected one of #{allowed.map(&:inspect).join(', ')}, got #{value.inspect}"
    end

    def self.int(name, value)
      return value if value.is_a?(Integer)
      return Integer(value.strip, 10) if value.is_a?(String) && value.strip.match?(/\A[+-]?\d+\z/)

      raise ConfigError, "#{name}: expected an integer, got #{value.inspect}"
    end

    def self.seconds(name, value)
      return value.to_f if value.is_a?(Integer) || (value.is_a?(Float) && value.finite?)
      if value.is_a?(String) && value.strip.match?(/\A[+-]?\d+(\.\d+)?\z/)
        return Float(value.strip)
      end

      raise ConfigError, "#{name}: expected a number of seconds, got #{value.inspect}"
    end

    def self.range(name, value, min, max)
      raise ConfigError, "#{name}: must be >= #{min} (got #{value})" if value < min
      raise ConfigError, "#{name}: must be <= #{max} (got #{value})" if value > max

      value
    end

    def self.bool(name, value)
      return value if value == true || value == false

      raise ConfigError, "#{name}: expected true or false, got #{value.inspect}"
    end

    def self.string(name, value)
      value = value.to_path if value.respond_to?(:to_path)
      value = value.to_s if value.is_a?(Symbol)
      raise ConfigError, "#{name}: expected a string, got #{value.inspect}" unless value.is_a?(String)
      raise ConfigError, "#{name}: must not be empty" if value.empty?

      value.dup.freeze
    end

    def self.directory(name, value)
      value = string(name, value)
      raise ConfigError, "#{name}: #{value} is not a directory" unless File.directory?(value)

      value
    end

    def self.handler(name, value)
      return nil if value.nil?
      raise ConfigError, "#{name}: expected a callable, got #{value.inspect}" unless value.respond_to?(:call)

      arity = value.respond_to?(:arity) ? value.arity : value.method(:call).arity
      required = arity.negative? ? -arity - 1 : arity
      if required > 3 || (arity >= 0 && arity < 1)
        raise ConfigError, "#{name}: the handler must take 1 to 3 arguments (error, env, status), it takes #{arity}"
      end

      value
    end

    # An Integer, a numeric String or :auto (one worker per usable CPU).
    def self.workers(name, value)
      return auto_workers if value.to_s == "auto"

      int(name, value)
    rescue ConfigError
      raise ConfigError, "#{name}: expected an integer or :auto, got #{value.inspect}"
    end

    # The CPUs this process may use: the cgroup CPU quota (v2 cpu.max, v1
    # cfs quota) or the scheduler affinity, whichever is smaller, rounded up
    # (a 1.5-CPU quota gets 2 workers so the quota can be used), at least 1.
    # Not the host's core count: a container limited to 2 CPUs gets 2.
    def self.auto_workers(machine = nil)
      require "serval/advice/machine"
      [(machine || Advice::Machine.new).cpus[:usable].ceil, 1].max
    end

    def self.plugins(name, value)
      Array(value).map do |plugin|
        plugin = string(name, plugin)
        raise ConfigError, "#{name}: unknown plugin #{plugin} (Serval has: #{PLUGINS.join(', ')})" unless PLUGINS.include?(plugin)

        plugin
      end.uniq.freeze
    end

    def self.sources(name, value)
      raise ConfigError, "#{name}: expected a Hash, got #{value.inspect}" unless value.is_a?(Hash)

      value.to_h { |k, v| [k.to_sym, string(name, v)] }.freeze
    end

    # A list of callables, each taking at most HOOKS[key] arguments.
    def self.hooks(name, key, value)
      allowed = HOOKS.fetch(key)
      Array(value).map do |hook|
        raise ConfigError, "#{name}: expected a block or a callable, got #{hook.inspect}" unless hook.respond_to?(:call)

        arity = hook.respond_to?(:arity) ? hook.arity : hook.method(:call).arity
        required = arity.negative? ? -arity - 1 : arity
        lambda_like = !hook.is_a?(Proc) || hook.lambda?
        if required > allowed || (lambda_like && arity >= 0 && arity != allowed)
          raise ConfigError, "#{name}: the block must take #{allowed} argument#{'s' unless allowed == 1}" \
                             "#{allowed == 1 ? ' (the worker index)' : ''}, it takes #{arity}"
        end

        hook
      end.freeze
    end

    # control_url, metrics_bind: one tcp:// or unix:// URI (plain HTTP only).
    def self.plain_bind(name, value)
      uri = string(name, value)
      raise ConfigError, "#{name}: expected tcp://HOST:PORT or unix://PATH, got #{uri}" unless uri.match?(%r{\A(tcp|unix)://})

      require "serval/binder"
      Binder.parse(uri)
      uri
    rescue ConfigError => e
      raise if e.message.start_with?("#{name}:")

      raise ConfigError, "#{name}: #{e.message}"
    end

    # agent_check_url: tcp://HOST:PORT (HAProxy's agent speaks TCP only).
    def self.tcp_url(name, value)
      url = string(name, value)
      port = url[%r{\Atcp://(?:\[[^\]]+\]|[^:/\[\]]+):(\d+)\z}, 1]
      raise ConfigError, "#{name}: expected tcp://HOST:PORT, got #{url}" unless port && port.to_i <= 65_535

      url
    end

    def self.binds(name, value)
      list = Array(value)
      raise ConfigError, "#{name}: at least one bind is needed" if list.empty?

      require "serval/binder"
      list.map do |uri|
        uri = string(name, uri)
        Binder.parse(uri) # raises ConfigError naming the bind
        uri
      end.freeze
    end

    private

    def find_file(path, environment)
      return nil if path == "-"

      if path
        raise ConfigError, "config file #{path} not found" unless File.file?(path)

        return path
      end
      self.class.default_files(environment).find { |f| File.file?(f) }
    end
  end
end
