# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "etc"
require "serval/dsl"
require "serval/boot_report"

# The environment-variable layer (WEB_CONCURRENCY, RAILS_MAX_THREADS, ...),
# the precedence flags > config file > env > defaults, and options[:sources].
class EnvConfigTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("serval-env-")
    @warnings = []
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # env: a Hash, or the variables as keyword-style arguments ("A" => "1").
  def load(env = nil, file: nil, cli: {}, cli_sources: {}, **vars)
    env ||= vars
    path = nil
    if file
      path = File.join(@dir, "puma.rb")
      File.write(path, file)
    end
    Serval::Configuration.load(cli: cli, cli_sources: cli_sources, config_file: path || "-", env: env,
                               warn: ->(m) { @warnings << m })
  end

  def cli(*calls)
    options = {}
    sources = {}
    dsl = Serval::DSL.new(options, ->(m) { @warnings << m }, sources: sources)
    calls.each do |flag, method, *args|
      dsl.source = "flag #{flag}"
      dsl.public_send(method, *args)
    end
    [options, sources]
  end

  def test_variables_set_workers_and_threads
    opts = load("WEB_CONCURRENCY" => "2", "RAILS_MAX_THREADS" => "4", "RAILS_MIN_THREADS" => "1")
    assert_equal [2, 1, 4], opts.values_at(:workers, :min_threads, :max_threads)
    assert_equal({ workers: "env WEB_CONCURRENCY", min_threads: "env RAILS_MIN_THREADS", max_threads: "env RAILS_MAX_THREADS" },
                 opts[:sources].slice(:workers, :min_threads, :max_threads))
  end

  def test_no_variables_means_defaults
    opts = load({})
    assert_equal [0, 0, 5, "development"], opts.values_at(:workers, :min_threads, :max_threads, :environment)
    assert_equal ["default"], opts[:sources].values.uniq
    assert_equal((Serval::Configuration::DEFAULTS.keys - [:sources]).sort, opts[:sources].keys.sort)
  end

  # Puma: only the maximum given leaves the minimum at its default (0).
  def test_max_alone_keeps_min_default
    opts = load("RAILS_MAX_THREADS" => "3")
    assert_equal [0, 3], opts.values_at(:min_threads, :max_threads)
    assert_equal "default", opts[:sources][:min_threads]
  end

  # RAILS_* first (what Rails apps set), then Puma's PUMA_* and bare names.
  def test_puma_names_and_their_order
    assert_equal 6, load("PUMA_MAX_THREADS" => "6", "MAX_THREADS" => "7")[:max_threads]
    assert_equal 7, load("MAX_THREADS" => "7")[:max_threads]
    opts = load("RAILS_MAX_THREADS" => "8", "PUMA_MAX_THREADS" => "6", "MIN_THREADS" => "2")
    assert_equal [2, 8], opts.values_at(:min_threads, :max_threads)
    assert_equal "env MIN_THREADS", opts[:sources][:min_threads]
  end

  def test_blank_variables_are_unset
    opts = load("WEB_CONCURRENCY" => " ", "RAILS_MAX_THREADS" => "")
    assert_equal [0, 5], opts.values_at(:workers, :max_threads)
  end

  def test_web_concurrency_auto_is_the_usable_cpu_count
    opts = load("WEB_CONCURRENCY" => "auto")
    assert_equal Serval::Configuration.auto_workers, opts[:workers]
    assert_operator opts[:workers], :<=, Etc.nprocessors
    assert_equal "env WEB_CONCURRENCY", opts[:sources][:workers]
  end

  # A container's CPU quota, not the host's cores (fixture trees of
  # /sys/fs/cgroup and /proc; test/fixtures/cgroup).
  def test_auto_workers_follow_the_cgroup_quota
    require "serval/advice/machine"
    root = File.expand_path("fixtures/cgroup", __dir__)
    machine = ->(name) { Serval::Advice::Machine.new(root: File.join(root, name)) }
    quota = machine.call("v2_limited").cpus
    assert_operator quota[:usable], :<, quota[:affinity], "the fixture's quota is below its 8 CPUs"
    assert_equal quota[:usable].ceil, Serval::Configuration.auto_workers(machine.call("v2_limited"))
    assert_equal 5, Serval::Configuration.auto_workers(machine.call("v2_unlimited")), "affinity 0-3,8"
  end

  def test_bad_values_name_the_variable
    error = assert_raises(Serval::ConfigError) { load("WEB_CONCURRENCY" => "abc") }
    assert_equal 'WEB_CONCURRENCY: expected a number of workers or auto, got "abc"', error.message
    error = assert_raises(Serval::ConfigError) { load("WEB_CONCURRENCY" => "-1") }
    assert_equal "WEB_CONCURRENCY: must be >= 0 (got -1)", error.message
    error = assert_raises(Serval::ConfigError) { load("RAILS_MAX_THREADS" => "lots") }
    assert_equal 'RAILS_MAX_THREADS: expected an integer, got "lots"', error.message
    error = assert_raises(Serval::ConfigError) { load("RAILS_MIN_THREADS" => "9") }
    assert_equal "threads: min (9, env RAILS_MIN_THREADS) must be <= max (5, default)", error.message
  end

  def test_config_file_beats_variables
    opts = load({ "WEB_CONCURRENCY" => "3", "RAILS_MAX_THREADS" => "8" }, file: "threads 2, 2\n")
    assert_equal [3, 2, 2], opts.values_at(:workers, :min_threads, :max_threads)
    file = "config file #{File.join(@dir, 'puma.rb')}"
    assert_equal [file, file, "env WEB_CONCURRENCY"], opts[:sources].values_at(:min_threads, :max_threads, :workers)
    assert_equal 0, load({ "WEB_CONCURRENCY" => "3" }, file: "workers 0\n")[:workers]
  end

  def test_flags_beat_config_file_and_variables
    cli, sources = cli(["-t", :threads, "1", "4"], ["-w", :workers, "1"], ["-b", :bind, "tcp://127.0.0.1:1"],
                       ["-p", :port, "2"])
    opts = load({ "WEB_CONCURRENCY" => "3", "RAILS_MAX_THREADS" => "8" }, file: "threads 2, 2\nport 7\n",
                cli: cli, cli_sources: sources)
    assert_equal [1, 1, 4], opts.values_at(:workers, :min_threads, :max_threads)
    assert_equal ["tcp://127.0.0.1:1", "tcp://0.0.0.0:2"], opts[:binds]
    assert_equal ["flag -w", "flag -t", "flag -t", "flag -b, flag -p"],
                 opts[:sources].values_at(:workers, :min_threads, :max_threads, :binds)
  end

  # RACK_ENV & co. are the environment layer too (and pick the config file).
  def test_environment_variables
    opts = load("RACK_ENV" => "staging", "RAILS_ENV" => "production")
    assert_equal ["staging", "env RACK_ENV"], [opts[:environment], opts[:sources][:environment]]
    assert_equal "production", load("RAILS_ENV" => "production")[:environment]
  end

  def test_boot_report_names_every_source
    cli, sources = cli(["-p", :port, "3000"])
    opts = load({ "WEB_CONCURRENCY" => "2", "RAILS_MIN_THREADS" => "1", "RAILS_ENV" => "production" },
                file: "threads 3, 3\nplugin :tmp_restart\n", cli: cli, cli_sources: sources)
    file = "config file #{File.join(@dir, 'puma.rb')}"
    assert_equal ["* Environment: production (env RAILS_ENV)", "* Threads: 3..3 (#{file})",
                  "* Workers: 2 (env WEB_CONCURRENCY), preload: true", "* Binds: tcp://0.0.0.0:3000 (flag -p)",
                  "* Plugins: tmp_restart (#{file})"], Serval::BootReport.lines(opts, preload: true)
    mixed = Serval::Configuration::DEFAULTS.merge(sources: { min_threads: "env RAILS_MIN_THREADS", max_threads: file })
    assert_includes Serval::BootReport.lines(mixed), "* Threads: 0..5 (min from env RAILS_MIN_THREADS, max from #{file})"
    # A hash without sources (in-process use) still reports.
    assert_includes Serval::BootReport.lines(Serval::Configuration::DEFAULTS.except(:sources)), "* Workers: 0 (unknown)"
  end
end
