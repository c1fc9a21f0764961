# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "serval/dsl"

class ConfigurationTest < Minitest::Test
  FIXTURES = File.expand_path("fixtures", __dir__)

  def setup
    @warnings = []
    @dir = Dir.mktmpdir("serval-config-")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # env: the environment variables the configuration reads (none by default,
  # so the runner's own WEB_CONCURRENCY etc. cannot leak in).
  def load_config(source = nil, cli: {}, file: nil, env: {}, **kw)
    if source
      file = File.join(@dir, "serval.rb")
      File.write(file, source)
    end
    Serval::Configuration.load(cli: cli, config_file: file || "-", warn: ->(m) { @warnings << m }, env: env, **kw)
  end

  def assert_config_error(pattern, source = nil, **kw)
    error = assert_raises(Serval::ConfigError) { load_config(source, **kw) }
    assert_match pattern, error.message
    error
  end

  def with_env(vars)
    old = vars.keys.to_h { |k| [k, ENV[k]] }
    vars.each { |k, v| ENV[k] = v }
    yield
  ensure
    old.each { |k, v| ENV[k] = v }
  end

  def test_defaults_are_frozen_and_complete
    defaults = Serval::Configuration::DEFAULTS
    assert defaults.frozen?
    assert defaults[:binds].frozen?
    assert_equal ["tcp://0.0.0.0:9292"], defaults[:binds]
    assert_equal [0, 5], defaults.values_at(:min_threads, :max_threads)
    assert_nil defaults[:max_body] # no limit, as Puma
    assert_equal Serval::Configuration::RULES.keys.sort, defaults.keys.sort
    options = load_config
    assert options.frozen?
    assert_equal defaults.keys, options.keys
  end

  def test_timing_sample_cap_is_a_count_a_second
    assert_equal 1000, load_config[:timing_sample_cap]
    assert_equal 0, load_config("timing_sample_cap 0\n")[:timing_sample_cap]
    assert_equal 250, load_config("timing_sample_cap 250\n")[:timing_sample_cap]
    assert_config_error(/timing_sample_cap/, "timing_sample_cap(-1)\n")
    assert_config_error(/timing_sample_cap/, "timing_sample_cap 2.5\n")
  end

  def test_dsl_sets_options
    options = load_config(<<~RUBY)
      threads 2, 8
      bind "tcp://127.0.0.1:0"
      port 4000, "::1"
      environment :production
      max_body 1024
      read_timeout 5
      worker_shutdown_timeout 7
      log_requests
      quiet
      early_hints
      tag "web"
      lowlevel_error_handler { |err, env| [500, {}, ["oops"]] }
    RUBY
    assert_equal [2, 8], options.values_at(:min_threads, :max_threads)
    assert_equal ["tcp://127.0.0.1:0", "tcp://[::1]:4000"], options[:binds]
    assert_equal "production", options[:environment]
    assert_equal 1024, options[:max_body]
    assert_equal 5.0, options[:read_timeout]
    assert_equal 7.0, options[:drain_timeout]
    assert options[:log_requests] && options[:quiet] && options[:early_hints]
    assert_equal "web", options[:tag]
    assert_respond_to options[:lowlevel_error_handler], :call
    assert_empty @warnings
  end

  def test_threads_min_above_max_names_option
    assert_config_error(/threads: min \(8\) must be <= max \(4\)/, "threads 8, 4")
  end

  def test_error_has_file_and_line
    error = assert_config_error(/serval\.rb:2: max_body: must be >= 0/, "threads 1, 2\nmax_body(-5)\n")
    refute_match(/\n/, error.message)
  end

  def test_type_errors_name_the_option
    assert_config_error(/read_timeout: expected a number of seconds/, "read_timeout 'soon'")
    assert_config_error(/max_connections: expected an integer/, "max_connections 1.5")
    assert_config_error(/log_requests: expected true or false/, "log_requests 'yes'")
    assert_config_error(/threads: max: must be >= 1/, "threads 0, 0")
    assert_config_error(/backlog: must be <= 65535/, "backlog 100_000")
    assert_config_error(/tmpdir: .* is not a directory/, "tmpdir '/nonexistent/dir'")
    assert_config_error(/bind ftp:\/\/x: expected/, "bind 'ftp://x'")
  end

  def test_hook_arity_is_checked
    assert_config_error(/lowlevel_error_handler: .*1 to 3 arguments/, "lowlevel_error_handler { 1 }")
    assert_config_error(/lowlevel_error_handler: .*1 to 3/, "lowlevel_error_handler ->(a, b, c, d) { }")
    assert load_config("lowlevel_error_handler { |*args| args }")[:lowlevel_error_handler]
  end

  def test_unknown_option_raises_naming_it
    assert_config_error(/unknown config option `max_bodyy`/, "max_bodyy 10")
  end

  def test_unsupported_options_warn_and_are_ignored
    options = load_config(<<~RUBY)
      workers 2
      preload_app!
      plugin :tmp_restart
      on_worker_boot { puts "never" }
      drain_on_shutdown
      worker_timeout 60
    RUBY
    assert_equal Serval::Configuration::DEFAULTS[:binds], options[:binds]
    assert_equal 1, @warnings.size
    assert_match(/\Aserval: config option `drain_on_shutdown` is not supported yet and is ignored \(/, @warnings.first)
    assert_equal [2, true, 60.0, 1], options.values_at(:workers, :preload_app, :worker_timeout).push(options[:before_worker_boot].size)
    assert_equal ["tmp_restart"], options[:plugins]
  end

  # tmp_restart is Serval's; systemd's job is built in (no warning); any
  # other name is a Puma plugin loaded from puma/plugin/NAME, and one that
  # is not on the load path fails the boot naming it (as in Puma).
  def test_plugins
    options = load_config(%(plugin :tmp_restart\nplugin "tmp_restart"\nplugin :systemd\n))
    assert_equal ["tmp_restart"], options[:plugins]
    assert_match(/config file .*serval\.rb/, options[:sources][:plugins])
    assert_empty @warnings
    assert_equal [], load_config[:plugins]
    assert_config_error(/plugins: unknown plugin nope/, cli: { plugins: ["nope"] })
    error = assert_raises(Serval::ConfigError) { load_config("plugin :solid_queue\n") }
    assert_match(/serval\.rb:1: plugin :solid_queue: .*is the plugin's gem in the Gemfile\?/, error.message)
  end

  def test_stdout_sync_is_on_unless_turned_off
    assert load_config[:stdout_sync]
    refute load_config("mutate_stdout_and_stderr_to_sync_on_write false")[:stdout_sync]
    refute load_config("stdout_sync false")[:stdout_sync]
  end

  def test_rails_config_loads_with_warnings_only
    with_env("RAILS_MAX_THREADS" => nil, "PORT" => nil, "PIDFILE" => nil, "SOLID_QUEUE_IN_PUMA" => nil) do
      options = load_config(file: File.join(FIXTURES, "rails_puma.rb"))
      assert_equal [3, 3], options.values_at(:min_threads, :max_threads)
      assert_equal ["tcp://0.0.0.0:3000"], options[:binds]
      assert_nil options[:pidfile]
      assert_equal ["tmp_restart"], options[:plugins]
      assert_empty @warnings
    end
    # SOLID_QUEUE_IN_PUMA=1 without solid_queue in the bundle: a clear error, not a silent skip
    with_env("RAILS_MAX_THREADS" => nil, "PORT" => nil, "PIDFILE" => nil, "SOLID_QUEUE_IN_PUMA" => "1") do
      error = assert_raises(Serval::ConfigError) { load_config(file: File.join(FIXTURES, "rails_puma.rb")) }
      assert_match(/plugin :solid_queue: Unable to find plugin: solid_queue/, error.message)
    end
  end

  def test_rails_config_reads_env_strings
    with_env("RAILS_MAX_THREADS" => "7", "PORT" => "4567", "PIDFILE" => "tmp/pids/server.pid",
             "SOLID_QUEUE_IN_PUMA" => nil) do
      options = load_config(file: File.join(FIXTURES, "rails_puma.rb"))
      assert_equal [7, 7], options.values_at(:min_threads, :max_threads)
      assert_equal ["tcp://0.0.0.0:4567"], options[:binds]
      assert_equal "tmp/pids/server.pid", options[:pidfile]
      assert_empty @warnings
    end
  end

  def test_rails71_config_loads_with_warnings_only
    with_env("RAILS_ENV" => nil, "RAILS_MAX_THREADS" => nil, "RAILS_MIN_THREADS" => nil, "PORT" => nil) do
      options = load_config(file: File.join(FIXTURES, "rails71_puma.rb"))
      assert_equal [5, 5], options.values_at(:min_threads, :max_threads)
      assert_equal "development", options[:environment]
      assert_equal "tmp/pids/server.pid", options[:pidfile]
      assert_equal ["tmp_restart"], options[:plugins]
      assert_empty @warnings
    end
  end

  def test_cli_beats_file_beats_defaults
    cli = {}
    dsl = Serval::DSL.new(cli, ->(m) { @warnings << m })
    dsl.threads("1", "2")
    options = load_config("threads 4, 4\nmax_body 10\nport 8000", cli: cli)
    assert_equal [1, 2], options.values_at(:min_threads, :max_threads)
    assert_equal 10, options[:max_body]
    assert_equal ["tcp://0.0.0.0:8000"], options[:binds]
    assert_equal 30.0, options[:read_timeout]
  end

  def test_final_check_covers_merged_layers
    cli = { max_request_line: 4096 }
    assert_config_error(/max_request_line \(4096\) must be <= max_head \(1024\)/, "max_head 1024", cli: cli)
  end

  def test_missing_config_file_and_syntax_error
    assert_config_error(/config file .*nope\.rb not found/, file: File.join(@dir, "nope.rb"))
    assert_config_error(/serval\.rb:1/, "threads 1,")
  end

  def test_default_file_is_found_by_environment
    Dir.chdir(@dir) do
      FileUtils.mkdir_p("config/serval")
      File.write("config/serval.rb", "max_body 1")
      File.write("config/serval/staging.rb", "max_body 2")
      config = Serval::Configuration.new(cli: { environment: "staging" }, warn: ->(_) {}, env: {})
      assert_equal 2, config.options[:max_body]
      assert_equal 1, Serval::Configuration.load(cli: { environment: "test" }, env: {})[:max_body]
    end
  end

  # Without Serval's own files, Puma's are read (config/puma/<env>.rb first),
  # the environment coming from the command line or else RAILS_ENV & co.
  def test_puma_config_files_are_the_fallback
    Dir.chdir(@dir) do
      FileUtils.mkdir_p("config/puma")
      File.write("config/puma.rb", "max_body 3")
      File.write("config/puma/production.rb", "max_body 4")
      load = ->(**kw) { Serval::Configuration.new(warn: ->(_) {}, **kw) }
      assert_equal [3, "config/puma.rb"], [load.call(env: {}).options[:max_body], load.call(env: {}).config_file]
      production = load.call(env: { "RAILS_ENV" => "production" })
      assert_equal [4, "config/puma/production.rb"], [production.options[:max_body], production.config_file]
      assert_equal "config file config/puma/production.rb", production.options[:sources][:max_body]
      assert_equal 4, load.call(cli: { environment: "production" }, env: {}).options[:max_body]
      File.write("config/serval.rb", "max_body 1")
      assert_equal 1, load.call(env: { "RAILS_ENV" => "production" }).options[:max_body]
      assert_equal 30.0, load.call(config_file: "-", env: {}).options[:read_timeout]
    end
  end
  # Puma's ssl_bind becomes an ssl:// bind with the same certificate options.
  def test_ssl_bind_is_an_ssl_bind
    opts = load_config(%(ssl_bind "127.0.0.1", 9443, cert: "/c.pem", key: "/k.pem", verify_mode: "none"))
    assert_equal ["ssl://127.0.0.1:9443?cert=%2Fc.pem&key=%2Fk.pem&verify_mode=none"], opts[:binds]
    assert_empty @warnings.grep(/ssl_bind/)
  end

  def test_ssl_bind_rejects_options_it_does_not_know
    assert_config_error(/ssl_bind: unsupported option\(s\) ssl_cipher_filter/,
                        %(ssl_bind "0.0.0.0", 9443, cert: "/c", key: "/k", ssl_cipher_filter: "x"))
  end

  def test_advice_log_interval
    assert_equal 60.0, load_config[:advice_log_interval]
    assert_equal 0.0, load_config("advice_log_interval 0")[:advice_log_interval]
    assert_equal 300.0, load_config("advice_log_interval 300")[:advice_log_interval]
    assert_config_error(/\Aadvice_log_interval: must be 0 \(off\) or >= 1\.0 \(got 0\.5\)/, "advice_log_interval 0.5")
    assert_config_error(/serval.rb:1: advice_log_interval: must be >= 0/, "advice_log_interval(-1)")
    assert_config_error(/serval.rb:1: advice_log_interval: expected a number of seconds/, "advice_log_interval 'often'")
  end

end
