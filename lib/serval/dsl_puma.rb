# frozen_string_literal: true

require "serval/configuration"

module Serval
  # The rest of Puma 8's config DSL (Puma::DSL), beside lib/serval/dsl.rb:
  # each method is implemented, mapped to a Serval option (said once at boot:
  # "serval: max_keep_alive 100 -> max_keepalive_requests 100"), or has no
  # effect for a stated reason (said once). docs/configuration.md "Every Puma 8
  # config method" has the table; the hooks and `plugin` are in dsl.rb.
  class DSL
    # Puma 8 methods that have no meaning for Serval => why (the boot says it).
    NO_EFFECT = {
      io_selector_backend: "the event loop is native (epoll), not nio4r",
      prune_bundler: "workers are forked from a master that keeps its bundle; to run a new Gemfile.lock " \
                     "use a hot restart (USR2), which re-execs and loads it",
      extra_runtime_dependencies: "it only serves prune_bundler",
      queue_requests: "the event loop always reads a whole request before a thread takes it (a slow client " \
                      "costs no thread); max_queue_time sheds load instead",
      nakayoshi_fork: "Puma 7 removed it",
      debug_rack_app: "not a Puma 8 option"
    }.freeze

    def set_default_host(host)
      @default_host = Configuration.string(:set_default_host, host)
    end

    def default_host
      @default_host || DEFAULT_HOST
    end

    def inject(&block)
      raise ConfigError, "inject: give a block" unless block

      instance_eval(&block)
    end

    # The value this file set so far (Serval's option names), else default.
    def get(key, default = nil)
      value = @options[key.to_sym]
      value.nil? ? default : value
    end

    # A Rack app (a callable, or the block) served instead of the rackup file.
    def app(obj = nil, &block)
      obj ||= block
      raise ConfigError, "app: give a block or a callable (a Rack app)" unless obj

      set(:app, obj)
    end

    # Config that applies only in single mode or only in cluster mode; run
    # once every layer is read (Configuration: workers from the flags, this
    # file or WEB_CONCURRENCY), in file order.
    def single(&block)
      mode_block(:single, block)
    end

    def cluster(&block)
      mode_block(:cluster, block)
    end

    def run_mode_blocks(mode)
      (@mode_blocks || {}).fetch(mode, []).each do |block|
        instance_eval(&block)
      rescue ConfigError, ScriptError, StandardError => e
        file, line = block.source_location
        message = e.is_a?(ConfigError) ? e.message : "#{e.class}: #{e.message}"
        raise ConfigError, "#{file}:#{line}: #{mode}: #{message}"
      end
      self
    end

    # $stdout/$stderr reopened on these files at boot (append: "a", else
    # truncated; a hot restart appends), reopened by name on HUP; workers
    # inherit them.
    def stdout_redirect(stdout = nil, stderr = nil, append = false)
      set(:redirect_stdout, stdout, name: "stdout_redirect: stdout")
      set(:redirect_stderr, stderr, name: "stdout_redirect: stderr")
      set(:redirect_append, append, name: "stdout_redirect: append")
    end

    # A block given each line Serval's log writer prints; prints what it returns.
    def log_formatter(callable = nil, &block)
      callable ||= block
      raise ConfigError, "log_formatter: give a block" unless callable

      set(:log_formatter, callable)
    end

    def custom_logger(logger)
      raise ConfigError, "custom_logger: give a logger (an object with #write or #<<)" if logger.nil?

      set(:custom_logger, logger)
    end

    # Mode of the state file, e.g. 0o640 (default 0600).
    def state_permission(permission)
      set(:state_permission, permission)
    end

    def raise_exception_on_sigterm(answer = true)
      set(:raise_exception_on_sigterm, answer)
    end

    # :any, or the methods served; any other gets 501 before the app.
    def supported_http_methods(methods)
      set(:supported_http_methods, methods)
    end

    # Which workers TTOU (or a smaller count) stops. :youngest, Serval's way,
    # stops the highest index, the one added last.
    # :youngest (Serval's default) or :oldest: which workers TTOU stops (Cluster#maintain).
    def worker_culling_strategy(strategy)
      set(:worker_culling_strategy, strategy)
    end

    # Seconds without a request (and none in flight) before a graceful stop.
    def idle_timeout(seconds)
      set(:idle_timeout, seconds)
    end

    def fiber_per_request(which = true)
      set(:fiber_per_request, which)
    end

    def clean_thread_locals(which = true)
      set(:fiber_per_request, which, name: :clean_thread_locals)
    end

    # Threads dumped to stderr when a stop begins; on_force: only when
    # requests are still running at the end of the drain.
    def shutdown_debug(val = true, on_force: false)
      val = Configuration.bool(:shutdown_debug, val)
      set(:shutdown_debug, val && on_force ? :on_force : val)
    end

    # What a hot restart execs, followed by the original arguments.
    def restart_command(cmd)
      set(:restart_command, cmd.to_s)
    end

    def rack_url_scheme(scheme = nil)
      set(:rack_url_scheme, scheme)
    end

    def silence_single_worker_warning
      set(:silence_single_worker_warning, true)
    end

    def silence_fork_callback_warning
      set(:silence_fork_callback_warning, true)
    end

    # Puma's tag '' means no tag.
    def tag(string)
      set(:tag, string.to_s.empty? ? nil : string)
    end

    # Puma's name for max_keepalive_requests (a Float, Float::INFINITY for no limit).
    def max_keep_alive(num_of_requests)
      return if num_of_requests.nil?

      keepalive(:max_keep_alive, num_of_requests)
    end

    # Puma 8: a deprecated max_keep_alive that does not override one given.
    def max_fast_inline(num_of_requests)
      return if num_of_requests.nil? || @options.key?(:max_keepalive_requests)

      keepalive(:max_fast_inline, num_of_requests)
    end

    # false: every response closes its connection.
    def enable_keep_alives(enabled = true)
      return unless Configuration.bool(:enable_keep_alives, enabled) == false

      set(:max_keepalive_requests, 1, name: :enable_keep_alives)
      mapped(:enable_keep_alives, "false -> max_keepalive_requests 1")
    end

    # :forever, :immediately or seconds: how long a graceful stop waits for requests.
    def force_shutdown_after(val = :forever)
      seconds = case val
                when :forever, "forever" then Configuration::DAY
                when :immediately, "immediately" then 0
                else Configuration.seconds(:force_shutdown_after, val)
                end
      set(:drain_timeout, seconds, name: :force_shutdown_after)
      mapped(:force_shutdown_after, "#{val} -> drain_timeout #{@options[:drain_timeout]}")
    end

    # Puma's delay for busy workers: Serval balances workers by GVL load.
    def wait_for_less_busy_worker(val = 0.005)
      on = Configuration.seconds(:wait_for_less_busy_worker, val).positive?
      set(:gvl_balance, on, name: :wait_for_less_busy_worker)
      mapped(:wait_for_less_busy_worker, "#{val} -> gvl_balance #{on}")
    end

    def drain_on_shutdown(which = true)
      return unless Configuration.bool(:drain_on_shutdown, which)

      not_yet(:drain_on_shutdown, "connections still in the listen backlog at a stop are not served; a hot restart " \
                                  "(USR2) keeps them")
    end

    # true: Serval's way already (an inherited socket no bind names serves too).
    # 'only': when sockets were passed in, binds none of them matches are
    # not bound (Binder#bind).
    def bind_to_activated_sockets(bind = true)
      store(:activated_sockets_only, bind.to_s == "only")
    end

    # Refork (docs/configuration.md): after worker 0 has served
    # after_requests requests, and on the refork command (SIGURG); 0: only
    # on the command; false: off.
    def fork_worker(after_requests = 1000)
      store(:fork_worker, after_requests == false ? nil : after_requests)
    end

    NO_EFFECT.each do |name, reason|
      define_method(name) do |*args, **_kw|
        answer = args.fetch(0, true)
        quiet = name == :queue_requests ? answer == true : [false, []].include?(answer) # Serval's way already
        no_effect(name, reason) unless quiet
      end
    end

    private

    def mode_block(mode, block)
      raise ConfigError, "#{mode}: give a block" unless block

      ((@mode_blocks ||= {})[mode] ||= []) << block
      nil
    end

    def keepalive(name, value)
      number = value.is_a?(Numeric) ? value : Configuration.seconds(name, value)
      number = Configuration::INT_MAX if number.to_f.infinite? || number > Configuration::INT_MAX
      set(:max_keepalive_requests, number.is_a?(Float) ? number.floor : number, name: name)
      mapped(name, "#{value} -> max_keepalive_requests #{@options[:max_keepalive_requests]}")
    end

    # Each said once per boot.
    def mapped(name, text)
      say_once(name, "serval: #{name} #{text}")
    end

    def no_effect(name, reason)
      say_once(name, "serval: `#{name}` has no effect in Serval: #{reason}")
    end

    def not_yet(name, reason)
      say_once(name, "serval: config option `#{name}` is not supported yet and is ignored (#{reason})")
    end

    def say_once(name, line)
      @said ||= {}
      return if @said[name] == line

      @said[name] = line
      @warn.call(line)
      nil
    end
  end
end
