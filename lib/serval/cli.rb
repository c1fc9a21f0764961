# frozen_string_literal: true

require "optparse"
require "rbconfig"
require "shellwords"
require "serval/version"
require "serval/errors"
require "serval/configuration"
require "serval/dsl"
require "serval/log_writer"
require "serval/signals"

module Serval
  # `serval [options] [rackup file]`. Flags are applied through the same DSL as
  # the config file (so they are checked the same way) into the top layer.
  class CLI
    # flag => [DSL method, value name, help]
    LIMITS = {
      "--max-body" => [:max_body, "BYTES", "Largest request body accepted (413 above)"],
      "--body-spill" => [:body_spill, "BYTES", "Bodies above this go to a temp file"],
      "--max-request-line" => [:max_request_line, "BYTES", "Longest request line (414 above)"],
      "--max-head" => [:max_head, "BYTES", "Largest request head (431 above)"],
      "--max-headers" => [:max_headers, "N", "Most header fields per request (431 above)"],
      "--max-connections" => [:max_connections, "N", "Open connections before accept pauses"],
      "--max-keepalive-requests" => [:max_keepalive_requests, "N", "Requests per keep-alive connection"],
      "--min-body-rate" => [:min_body_rate, "BYTES_PER_SEC", "Slowest average upload after read_timeout (0: off)"],
      "--max-queue-time" => [:max_queue_time, "SEC", "Answer 503 when a request would wait longer for a thread (0: off)"],
      "--output-buffer" => [:output_buffer, "BYTES", "Response bytes buffered per connection"],
      "--output-budget" => [:output_budget, "BYTES", "Response bytes buffered by all connections together"],
      "--max-spill" => [:max_spill, "BYTES", "Response bytes spilled to tmpdir by all connections together"],
      "--first-data-timeout" => [:first_data_timeout, "SEC", "Wait for a new connection's first byte"],
      "--read-timeout" => [:read_timeout, "SEC", "Wait between bytes of a request"],
      "--persistent-timeout" => [:persistent_timeout, "SEC", "Idle keep-alive wait"],
      "--write-timeout" => [:write_timeout, "SEC", "Wait for a slow reader to take bytes"],
      "--drain-timeout" => [:drain_timeout, "SEC", "Graceful stop: time for in-flight requests"],
      "--thread-idle-timeout" => [:thread_idle_timeout, "SEC", "Idle time before a thread above min exits"],
      "--backlog" => [:backlog, "N", "listen(2) backlog for binds without ?backlog="],
      "--tmpdir" => [:tmpdir, "DIR", "Where large bodies are spilled"],
      "--max-io-threads" => [:max_io_threads, "N", "I/O lane: threads above max while requests idle in flight (0: off)"],
      "--io-lane-idle" => [:io_lane_idle, "SEC", "I/O lane: idle time after which a request counts as idle"],
      "--auto-interval" => [:auto_interval, "SEC", "threads auto: seconds between measurements"]
    }.freeze

    def initialize(argv, stdout: $stdout, stderr: $stderr)
      @argv = argv.dup
      @original_argv = argv.dup.freeze
      @stdout = stdout
      @stderr = stderr
      @cli = {}
      @sources = {}
      @config_file = nil
      @dsl = DSL.new(@cli, ->(msg) { @stderr.puts(msg) }, sources: @sources)
    end

    # Returns the process exit status.
    def run
      return 0 if parse == :done

      options = Configuration.load(cli: @cli, cli_sources: @sources, config_file: @config_file,
                                   warn: ->(msg) { @stderr.puts(msg) })
      log_writer = LogWriter.new(stdout: @stdout, stderr: @stderr,
                                 quiet: options[:quiet], verbose: options[:verbose])
      status = run_launcher(options, log_writer)
      # Puma's raise_exception_on_sigterm: a TERM stop ends the process by SIGTERM
      raise SignalException, "TERM" if options[:raise_exception_on_sigterm] && Signals.term_received?

      status
    rescue OptionParser::ParseError => e
      fail_with("#{e.message} (see serval --help)")
    rescue ConfigError => e
      fail_with(e.message)
    end

    private

    def run_launcher(options, log_writer)
      require "serval/launcher"
      Launcher.new(options, log_writer: log_writer, restart_argv: restart_argv(options[:restart_command])).run
    rescue ConfigError
      raise
    rescue StandardError, ScriptError => e
      log_writer.exception(e, "serval: boot failed")
      1
    end

    # What a hot restart (USR2) execs: this same command line, or Puma's
    # restart_command followed by the same arguments.
    def restart_argv(command = nil)
      return [*Shellwords.split(command), *@original_argv] if command

      [RbConfig.ruby, *($VERBOSE ? ["-w"] : []), File.expand_path($PROGRAM_NAME), *@original_argv]
    end

    def fail_with(message)
      @stderr.puts("serval: #{message}")
      1
    end

    def parse
      opts = parser
      rest = opts.parse(split_equals(opts, @argv))
      return :done if @done
      raise ConfigError, "too many arguments: #{rest.join(' ')} (one rackup file at most)" if rest.size > 1

      @dsl.rackup(rest.first) if rest.first
      nil
    end

    # `--port=9292` as `--port 9292`: optparse (0.2-0.4) with require_exact
    # rejects the = form of every long option. Only for a known option that
    # takes an argument, and only before a bare `--`.
    def split_equals(opts, argv)
      out = []
      argv.each_with_index do |arg, i|
        return out + argv[i..] if arg == "--"

        name, value = arg.split("=", 2)
        switch = value && name.start_with?("--") && opts.top.search(:long, name.delete_prefix("--"))
        switch && switch.arg ? out.push(name, value) : out.push(arg)
      end
      out
    end

    def parser
      OptionParser.new do |o|
        o.banner = "Usage: serval [options] [rackup file (default config.ru)]"
        o.require_exact = true
        o.separator ""
        basic_options(o)
        control_options(o)
        o.separator ""
        o.separator "Limits and timeouts (see docs/configuration.md):"
        LIMITS.each do |flag, (method, arg, help)|
          on(o, "#{flag} #{arg}", help) { |v| @dsl.public_send(method, v) }
        end
        o.separator ""
        puma_options(o)
      end
    end

    def basic_options(o)
      on(o, "-b", "--bind URI", "Listen on URI: tcp://HOST:PORT, unix://PATH (repeatable)") { |v| @dsl.bind(v) }
      on(o, "-p", "--port PORT", "Listen on tcp://0.0.0.0:PORT (repeatable)") { |v| @dsl.port(v) }
      on(o, "-t", "--threads MIN:MAX", "Thread pool size (-t N means N:N; default 0:5 or $RAILS_MIN/MAX_THREADS); " \
                                       "auto, auto:MAX or MIN:auto: set from measurement (docs/tuning.md)") { |v| threads(v) }
      on(o, "-e", "--environment ENV", "App environment (default $APP_ENV, $RACK_ENV, $RAILS_ENV or development)") { |v| @dsl.environment(v) }
      on(o, "-C", "--config FILE", "Config file (default config/serval.rb or config/puma.rb, docs/configuration.md; - for none)") { |v| @config_file = v }
      on(o, "--dir DIR", "Change to DIR before loading the app") { |v| @dsl.directory(v) }
      on(o, "--pidfile PATH", "Write the process id to PATH") { |v| @dsl.pidfile(v) }
      on(o, "--tag NAME", "Add NAME to the process title") { |v| @dsl.tag(v) }
      on(o, "--log-requests", "Log one line per request on stdout") { @dsl.log_requests(true) }
      on(o, "-q", "--quiet", "Do not print boot and stop messages") { @dsl.quiet(true) }
      on(o, "-v", "--verbose", "Print debugging detail") { @dsl.verbose(true) }
      on(o, "--early-hints", "Let the app send 103 Early Hints") { @dsl.early_hints(true) }
      on(o, "--fair-timeslice MS", "GVL slice of a computing request thread while another waits (default: off, Ruby's 100 ms; 2 is a good start)") { |v| @dsl.fair_timeslice(v) }
      on(o, "--no-fair-timeslice", "Leave request threads Ruby's own time slice (100 ms)") { @dsl.fair_timeslice(false) }
      on(o, "-V", "--version", "Print the version and exit") { done(@stdout.puts("Serval #{VERSION}")) }
      on(o, "-h", "--help", "Show this help and exit") { done(@stdout.puts(o.help)) }
    end

    # docs/control.md
    def control_options(o)
      on(o, "--control-url URL", "Serve the control app on unix://PATH or tcp://HOST:PORT") { |v| @dsl.control_url(v) }
      on(o, "--control-token TOKEN", "Control app token (default: generated and printed)") { |v| @dsl.control_auth_token(v) }
      on(o, "--metrics-bind URI", "Serve Prometheus /metrics on URI (no token)") { |v| @dsl.metrics_bind(v) }
      on(o, "-S", "--state PATH", "Write pid, control URL and token to PATH (YAML)") { |v| @dsl.state_path(v) }
      on(o, "--db-pool-wait", "Measure pool_wait: patches Active Record's private ConnectionPool::Queue#wait_poll") { @dsl.db_pool_wait(true) }
    end

    def puma_options(o)
      o.separator "Cluster mode (docs/signals.md):"
      on(o, "-w", "--workers N", "Forked worker processes, or auto (0 = single mode; default $WEB_CONCURRENCY or 0)") { |v| @dsl.workers(v) }
      on(o, "--preload", "Load the app in the master before forking (default with -w > 1)") { @dsl.preload_app! }
      on(o, "--fork-worker [N]", "Refork workers from a warmed worker after N requests (default 1000)") do |v|
        @dsl.fork_worker(v.nil? ? 1000 : v)
      end
      # two flags, not --[no-]: optparse 0.4's require_exact rejects the --no- form
      on(o, "--gvl-balance", "A GVL-bound worker leaves new and keep-alive connections to idle siblings (default)") { @dsl.gvl_balance(true) }
      on(o, "--no-gvl-balance", "Turn that off (docs/tuning.md \"Balancing workers\")") { @dsl.gvl_balance(false) }
      on(o, "--thread-polls", "Request threads read new requests between requests, the loop parks (default; docs/DESIGN.md)") { @dsl.thread_polls(true) }
      on(o, "--no-thread-polls", "The event-loop thread reads every request and wakes a thread for it") { @dsl.thread_polls(false) }
      on(o, "--agent-check-url URL", "Answer HAProxy agent-check on tcp://HOST:PORT (docs/deployment.md)") { |v| @dsl.agent_check_url(v) }
      on(o, "--idle-timeout SEC", "Stop gracefully after SEC without a request") { |v| @dsl.idle_timeout(v) }
      on(o, "--redirect-stdout FILE", "Send stdout to FILE (reopened on HUP)") { |v| @dsl.stdout_redirect(v, @cli[:redirect_stderr], @cli[:redirect_append]) }
      on(o, "--redirect-stderr FILE", "Send stderr to FILE (reopened on HUP)") { |v| @dsl.stdout_redirect(@cli[:redirect_stdout], v, @cli[:redirect_append]) }
      on(o, "--redirect-append", "Append to the redirect files instead of truncating them") { @dsl.stdout_redirect(@cli[:redirect_stdout], @cli[:redirect_stderr], true) }
    end

    # o.on, recording the flag as the source of what its block sets.
    def on(o, *spec, &block)
      flag = spec.first.split.first
      o.on(*spec) do |*values|
        @dsl.source = "flag #{flag}"
        block.call(*values)
      end
    end

    def done(_)
      @done = true
    end

    def threads(value)
      min, max, extra = value.split(":", -1)
      raise ConfigError, "threads: expected MIN:MAX, N, auto, auto:MAX or MIN:auto, got #{value.inspect}" if extra || min.nil?

      @dsl.threads(min, max || min)
    end
  end
end
