# frozen_string_literal: true

require "uri"

require "serval/configuration"

module Serval
  # The config file language: Puma's names and meanings, plus Serval's own
  # limits under the same names as the option keys. Each call checks its
  # value at once and writes into the hash given to #initialize.
  #
  #   threads 1, 8
  #   port ENV.fetch("PORT", 3000)
  #   max_body 10 * 1024 * 1024
  class DSL
    # Puma options Serval accepts and ignores with a warning. The rest of
    # Puma 8's DSL beyond this file: lib/serval/dsl_puma.rb.
    UNSUPPORTED = %i[].freeze

    # Serval options set with one value, named like their keys.
    PLAIN = %i[
      max_request_line max_head max_headers max_body body_spill max_chunk_ext
      first_data_timeout read_timeout persistent_timeout write_timeout max_connections
      output_buffer output_budget max_spill max_keepalive_requests min_body_rate max_queue_time tmpdir
      drain_timeout thread_idle_timeout backlog environment rackup directory pidfile state_path metrics_bind
      control_url control_auth_token error_log_limit gvl_balance gvl_balance_interval agent_check_url thread_polls
      threads_auto_max auto_interval max_io_threads io_lane_idle db_pool_wait
      worker_max_requests worker_max_requests_jitter worker_max_memory
      request_timeout request_timeout_raise request_timeout_grace
    ].freeze

    DEFAULT_HOST = "0.0.0.0"

    # Puma plugins whose job Serval does without them.
    BUILT_IN_PLUGINS = %w[systemd].freeze

    # What later calls are recorded as in sources (the CLI sets it per flag).
    attr_accessor :source

    # options:      the hash calls write into
    # warn:         callable receiving warning lines
    # sources:      a hash that gets key => source for every key written
    # default_host: the host `port N` binds (Puma's handler passes Rails's Host)
    # auto_value:   what RAILS_MAX_THREADS=auto was replaced with before the
    #               file ran (EnvConfig.export_auto): `threads` given that
    #               value means auto
    def initialize(options, warn, sources: nil, source: nil, default_host: nil, auto_value: nil)
      @auto_value = auto_value
      @options = options
      @warn = warn
      @sources = sources
      @source = source
      @default_host = default_host
    end

    # Evaluates a config file; errors are re-raised as ConfigError with the
    # file and line in front of the message.
    def load_file(path)
      instance_eval(File.read(path), path, 1)
      self
    rescue ConfigError => e
      raise ConfigError, "#{where(e, path)}#{e.message}"
    rescue ScriptError, StandardError => e
      raise ConfigError, "#{where(e, path)}#{e.class}: #{e.message}"
    end

    # Puma's `load`: evaluate another config file in the same context.
    def load(path)
      load_file(path)
    end

    PLAIN.each do |key|
      define_method(key) { |value| set(key, value) }
    end

    # oob_gc N: a full GC when idle, once per N requests; true is 1, false off.
    def oob_gc(every = true)
      set(:oob_gc, { true => 1, false => nil }.fetch(every, every))
    end

    def bind(uri)
      uri = Configuration.string(:bind, uri)
      require "serval/binder"
      Binder.parse(uri)
      store(:binds, [*@options[:binds], uri], accumulate: true)
    end

    # Puma's ssl_bind(host, port, opts): the same as bind "ssl://host:port?cert=..&key=..".
    # Supported opts: cert, key, ca, verify_mode ("none" or "peer"); others fail naming them.
    SSL_BIND_KEYS = %i[cert key ca verify_mode].freeze

    def ssl_bind(host, port, opts = {})
      host = Configuration.string(:ssl_bind, host)
      port = Configuration.range(:ssl_bind, Configuration.int(:ssl_bind, port), 0, 65_535)
      raise ConfigError, "ssl_bind: options must be a Hash" unless opts.is_a?(Hash)

      unknown = opts.keys.map(&:to_sym) - SSL_BIND_KEYS
      raise ConfigError, "ssl_bind: unsupported option(s) #{unknown.join(', ')}" unless unknown.empty?

      query = opts.map { |k, v| "#{k}=#{URI.encode_www_form_component(v.to_s)}" }.join("&")
      host = "[#{host}]" if host.include?(":") && !host.start_with?("[")
      bind("ssl://#{host}:#{port}#{query.empty? ? '' : "?#{query}"}")
    end

    def clear_binds!
      store(:binds, [])
    end

    def port(port, host = nil)
      port = Configuration.range(:port, Configuration.int(:port, port), 0, 65_535)
      host = host.nil? ? @default_host || DEFAULT_HOST : Configuration.string(:port, host)
      host = "[#{host}]" if host.include?(":") && !host.start_with?("[")
      bind("tcp://#{host}:#{port}")
    end

    # threads MIN, MAX; threads :auto (Serval picks the count, docs/tuning.md);
    # threads MIN, :auto; threads :auto, MAX (auto, at most MAX).
    def threads(min, max = min)
      return auto_threads(min, max) if auto?(min) || auto?(max)

      min = Configuration.coerce(:min_threads, min, name: "threads: min")
      max = Configuration.coerce(:max_threads, max, name: "threads: max")
      raise ConfigError, "threads: min (#{min}) must be <= max (#{max})" if min > max

      store(:min_threads, min)
      store(:max_threads, max)
      store(:threads_auto, false) # a count given here wins over an auto from a lower layer
    end

    def auto_threads(min, max)
      if auto?(min) && !auto?(max)
        store(:threads_auto_max, Configuration.coerce(:threads_auto_max, max, name: "threads: auto:MAX"))
      elsif !auto?(min)
        store(:min_threads, Configuration.coerce(:min_threads, min, name: "threads: min"))
        store(:threads_auto_min, @options[:min_threads]) # auto's floor (Configuration.settle_auto)
      end
      store(:threads_auto, true)
    end

    def auto?(value)
      value.to_s == "auto" || (!@auto_value.nil? && value.to_s.strip == @auto_value)
    end

    def log_requests(value = true)
      set(:log_requests, value)
    end

    def quiet(value = true)
      set(:quiet, value)
    end

    def verbose(value = true)
      set(:verbose, value)
    end

    # Puma's `debug` prints extra detail; ours maps it to verbose logging.
    def debug
      set(:verbose, true)
    end

    def early_hints(value = true)
      set(:early_hints, value)
    end

    # Puma's set_remote_address: REMOTE_ADDR from the socket (:socket, the
    # default), a fixed text (:localhost, "10.0.0.1"), a request header
    # (header: "X-Forwarded-For": its first element) or the PROXY header each
    # connection must start with (proxy_protocol: :v1, :v2 or :any).
    # docs/configuration.md "REMOTE_ADDR"; checks in lib/serval/remote_address.rb.
    def set_remote_address(value = :socket, **kw)
      if !kw.empty? && value != :socket
        raise ConfigError, "set_remote_address: give one value, got #{value.inspect} and #{kw.inspect}"
      end

      set(:remote_address, kw.empty? ? value : kw, name: :set_remote_address)
    end

    # Puma's `plugin :name`. tmp_restart is Serval's own (lib/serval/plugins);
    # systemd's job is built in; any other name is a Puma plugin, loaded now
    # from puma/plugin/NAME on the load path and started with the launcher
    # (lib/serval/puma_plugins.rb). A plugin that cannot be found fails the
    # boot, as in Puma.
    def plugin(name)
      name = Configuration.string(:plugin, name.to_s)
      if Configuration::PLUGINS.include?(name)
        store(:plugins, [*@options[:plugins], name].uniq, accumulate: true)
      elsif !BUILT_IN_PLUGINS.include?(name)
        require "serval/puma_plugins"
        return nil if (@options[:puma_plugins] || []).any? { |n, _| n == name }

        instance = PumaPlugins.create(name)
        store(:puma_plugins, [*@options[:puma_plugins], [name, instance]], accumulate: true)
        instance.config(self) if instance.respond_to?(:config)
      end
      nil
    end

    # stdout/stderr flush on every write (on by default, as in Puma), so
    # logs reach a pipe (Docker, systemd) at once.
    def stdout_sync(value = true)
      set(:stdout_sync, value)
    end

    def mutate_stdout_and_stderr_to_sync_on_write(value = true)
      set(:stdout_sync, value, name: :mutate_stdout_and_stderr_to_sync_on_write)
    end

    # Per-request timing (docs/observability.md): on by default.
    def timing(value = true)
      set(:timing, value)
    end

    # Share of requests whose thread CPU time is read, 0.0..1.0 (default 0.05):
    # the CPU clock is a system call; queue, wall, GC and the GVL split are
    # measured for every request.
    def timing_sample_rate(rate)
      set(:timing_sample_rate, rate)
    end

    # Sampled requests a second at most while timing_sample_rate is below 1
    # (default 1000; 0: no cap): at high request rates the sampled share's
    # system calls, not its precision, grow (docs/observability.md).
    def timing_sample_cap(per_second)
      set(:timing_sample_cap, per_second)
    end

    # Seconds between the advice checks that log `advice: ...` when the
    # advice is first available or changes (docs/tuning.md); 0 turns them off.
    def advice_log_interval(seconds)
      set(:advice_log_interval, seconds)
    end

    # Milliseconds a request thread that computes may keep the GVL from a
    # waiting thread (docs/tuning.md "Fairness"); false or 0 turns it off.
    def fair_timeslice(ms = true)
      set(:fair_timeslice, ms)
    end

    def lowlevel_error_handler(handler = nil, &block)
      handler ||= block
      raise ConfigError, "lowlevel_error_handler: give a block or a callable" unless handler

      set(:lowlevel_error_handler, handler)
    end

    # Puma's name for the graceful-stop drain time.
    def worker_shutdown_timeout(seconds)
      set(:drain_timeout, seconds, name: :worker_shutdown_timeout)
    end

    # Puma 6's name for the request body limit.
    def http_content_length_limit(bytes)
      set(:max_body, bytes, name: :http_content_length_limit)
    end

    # Cluster mode (docs/configuration.md): N forked workers, or :auto (one per CPU).
    def workers(count)
      set(:workers, count)
    end

    def preload_app!(value = true)
      set(:preload_app, value, name: :preload_app!)
    end

    def worker_timeout(seconds)
      set(:worker_timeout, seconds)
    end

    def worker_boot_timeout(seconds)
      set(:worker_boot_timeout, seconds)
    end

    def worker_check_interval(seconds)
      set(:worker_check_interval, seconds)
    end

    # Puma's hooks (docs/configuration.md "Hooks"); each may be given many
    # times (run in order). Those Puma passes the worker index take
    # `hook(:key) { |index, data| }` too: data is a Hash kept per key and
    # per process, shared by the hooks given that key.
    Configuration::HOOKS.each_key do |key|
      define_method(key) { |*args, &block| hook(key, key, *args, &block) }
    end

    # Puma's other names for the same hooks.
    HOOK_ALIASES = { on_worker_boot: :before_worker_boot, on_worker_shutdown: :before_worker_shutdown,
                     on_worker_fork: :before_worker_fork, after_worker_fork: :after_worker_boot,
                     on_booted: :after_booted, on_restart: :before_restart, on_stopped: :after_stopped,
                     on_refork: :before_refork, on_thread_start: :before_thread_start,
                     on_thread_exit: :before_thread_exit }.freeze

    HOOK_ALIASES.each do |name, key|
      define_method(name) { |*args, &block| hook(key, name, *args, &block) }
    end

    CONTROL_KEYS = %i[auth_token no_token data_only].freeze

    # Puma's control app (docs/control.md). A token is always required: give
    # auth_token, or one is generated and printed at boot.
    def activate_control_app(url = nil, opts = {})
      if url.nil? || url == "auto"
        raise ConfigError, "activate_control_app: give a URL (unix://PATH or tcp://HOST:PORT)"
      end

      opts = opts.transform_keys(&:to_sym)
      unknown = opts.keys - CONTROL_KEYS
      raise ConfigError, "activate_control_app: unknown option `#{unknown.first}`" unless unknown.empty?
      if opts[:no_token]
        raise ConfigError, "activate_control_app: no_token is not supported (the control app always requires a token)"
      end

      @warn.call("serval: activate_control_app: data_only is not supported and is ignored") if opts.key?(:data_only)
      set(:control_url, url, name: :activate_control_app)
      set(:control_auth_token, opts[:auth_token], name: "activate_control_app: auth_token") if opts[:auth_token]
    end

    UNSUPPORTED.each do |name|
      define_method(name) { |*_args, **_kw, &_block| unsupported(name) }
    end

    # A config method a Puma plugin added (`solid_queue_mode :async`) runs
    # on a Puma::DSL whose @options is options[:plugin_options].
    def method_missing(name, *args, **kwargs, &block)
      if defined?(PumaPlugins) && PumaPlugins.dsl_method?(name)
        plugin_options = (@options[:plugin_options] ||= {})
        return PumaPlugins.call_dsl(name, plugin_options, args, kwargs, block)
      end
      raise ConfigError, "unknown config option `#{name}`"
    end

    def respond_to_missing?(name, include_private = false)
      (defined?(PumaPlugins) && PumaPlugins.dsl_method?(name)) || super
    end

    private

    def set(key, value, name: key)
      store(key, Configuration.coerce(key, value, name: name))
    end

    # hook(key, name, callable) or hook(key, name, :data_key) { |index, data| }
    def hook(key, name, *args, &block)
      raise ConfigError, "#{name}: give a block or a callable, not both" if args.size > 1 || (block && args.first.respond_to?(:call))

      callable = block || args.first
      data_key = block ? args.first : nil
      raise ConfigError, "#{name}: give a block" unless callable.respond_to?(:call)

      if data_key
        unless data_key.is_a?(Symbol) || data_key.is_a?(String)
          raise ConfigError, "#{name}: the key must be a Symbol or a String, got #{data_key.inspect}"
        end

        callable = with_hook_data(Configuration::HOOKS.fetch(key), data_key.to_sym, callable)
      end
      list = Configuration.coerce(key, [callable], name: name)
      store(key, ((@options[key] || []) + list).freeze, accumulate: true)
    end

    # Puma's keyed hooks: the block gets the hook's arguments and a Hash
    # shared by every hook of that key in this process (a forked worker has
    # its own copy).
    def with_hook_data(allowed, data_key, block)
      shared = (@hook_data ||= Hash.new { |h, k| h[k] = {} })
      if allowed.zero?
        proc { block.call(shared[data_key]) }
      else
        proc { |arg = nil| block.call(arg, shared[data_key]) }
      end
    end

    # The one way values are written. accumulate: the value adds to what this
    # layer already had, so both sources are named ("flag -b, flag -p").
    def store(key, value, accumulate: false)
      @options[key] = value
      return value unless @sources && @source

      old = @sources[key]
      @sources[key] = accumulate && old && !old.split(", ").include?(@source) ? "#{old}, #{@source}" : @source
      value
    end

    def unsupported(name)
      @warn.call("serval: config option `#{name}` is not supported yet and is ignored")
      nil
    end

    def where(error, path)
      loc = (error.backtrace_locations || []).find { |l| l.path == path }
      line = loc&.lineno || error.message[/\A#{Regexp.escape(path)}:(\d+)/, 1]
      prefix = line ? "#{path}:#{line}: " : "#{path}: "
      error.message.start_with?(path) ? "" : prefix
    end
  end
end

require "serval/dsl_puma"
