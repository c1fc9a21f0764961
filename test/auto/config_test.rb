# frozen_string_literal: true

require "test_helper"
require "serval/cli"
require "serval/dsl"
require "serval/configuration"

# threads :auto and the I/O lane's options: every spelling, and bad values
# failing at boot with the option's name.
class AutoConfigTest < Minitest::Test
  def load(env: {}, file: nil, argv: nil)
    cli = {}
    sources = {}
    if argv
      c = Serval::CLI.new(argv, stdout: StringIO.new, stderr: StringIO.new)
      c.send(:parse)
      cli = c.instance_variable_get(:@cli)
      sources = c.instance_variable_get(:@sources)
    end
    path = nil
    if file
      path = File.join(Dir.mktmpdir("serval-auto-"), "serval.rb")
      File.write(path, file)
    end
    Serval::Configuration.load(cli: cli, cli_sources: sources, config_file: path || "-", env: env, warn: ->(_) {})
  end

  def auto(opts) = opts.values_at(:threads_auto, :min_threads, :max_threads, :threads_auto_max)

  def test_defaults_are_off
    opts = load
    assert_equal [false, 0, 5, 16], auto(opts)
    assert_equal [0, 0.5, 5.0], opts.values_at(:max_io_threads, :io_lane_idle, :auto_interval)
  end

  def test_cli_spellings
    assert_equal [true, 0, 5, 16], auto(load(argv: %w[-t auto]))
    assert_equal [true, 0, 3, 3], auto(load(argv: %w[-t auto:3])), "starts at 5, within the cap"
    assert_equal [true, 0, 5, 12], auto(load(argv: %w[-t auto:12]))
    assert_equal [true, 2, 5, 16], auto(load(argv: %w[-t 2:auto]))
    assert_equal [true, 8, 8, 16], auto(load(argv: %w[-t 8:auto])), "starts at least at min"
    assert_equal "flag -t", load(argv: %w[-t auto])[:sources][:threads_auto]
    opts = load(argv: %w[--max-io-threads 20 --io-lane-idle 0.2 --auto-interval 2])
    assert_equal [20, 0.2, 2.0], opts.values_at(:max_io_threads, :io_lane_idle, :auto_interval)
  end

  def test_config_file_spellings
    assert_equal [true, 0, 5, 16], auto(load(file: "threads :auto"))
    assert_equal [true, 1, 5, 16], auto(load(file: "threads 1, :auto"))
    assert_equal [true, 0, 5, 10], auto(load(file: "threads :auto, 10"))
    assert_equal [true, 0, 5, 6], auto(load(file: "threads :auto\nthreads_auto_max 6"))
    assert_equal [4, 1.0], load(file: "max_io_threads 4\nio_lane_idle 1").values_at(:max_io_threads, :io_lane_idle)
  end

  # Auto's floor is a minimum given with auto; a minimum that came with a
  # fixed count in a lower layer (a config file's `threads 5, 5` under
  # `-t auto`) only says how many threads start, never above where auto starts.
  def test_auto_floor_is_a_minimum_given_with_auto
    floor = ->(opts) { Serval::Configuration.auto_floor(opts) }
    opts = load(file: "threads 5, 5", argv: %w[-t auto])
    assert_equal [true, 5, 5, 16], auto(opts)
    assert_equal 1, floor.(opts), "-t auto over `threads 5, 5`: may go below 5"
    opts = load(file: "threads 5, 5", argv: %w[-t auto:3])
    assert_equal [true, 3, 3, 3], auto(opts), "starts at 3 threads, not 5"
    assert_equal 1, floor.(opts)
    assert_equal 2, floor.(load(argv: %w[-t 2:auto]))
    assert_equal 2, floor.(load(file: "threads 2, :auto"))
    assert_equal 2, floor.(load(file: "threads 2, :auto", argv: %w[-t auto])), "auto without a minimum keeps one given with auto"
    assert_equal 1, floor.(load(env: { "RAILS_MAX_THREADS" => "auto", "RAILS_MIN_THREADS" => "4" }))
    assert_equal 1, floor.(load(argv: %w[-t auto]))
  end

  def test_rails_max_threads_auto
    opts = load(env: { "RAILS_MAX_THREADS" => "auto" })
    assert_equal [true, 0, 5, 16], auto(opts)
    assert_equal "env RAILS_MAX_THREADS", opts[:sources][:threads_auto]
    # a number in the env is where auto starts when the file says auto
    assert_equal [true, 0, 3, 16], auto(load(env: { "RAILS_MAX_THREADS" => "3" }, file: "threads :auto"))
    # the command line wins over the env
    assert_equal [false, 2, 2, 16], auto(load(env: { "RAILS_MAX_THREADS" => "auto" }, argv: %w[-t 2]))
  end

  def test_bad_values_name_the_option
    e = assert_raises(Serval::ConfigError) { load(argv: %w[-t auto:0]) }
    assert_match(/threads: auto:MAX: must be >= 1/, e.message)
    e = assert_raises(Serval::ConfigError) { load(argv: %w[-t auto:lots]) }
    assert_match(/threads: auto:MAX/, e.message)
    e = assert_raises(Serval::ConfigError) { load(argv: %w[-t 9:auto:3]) }
    assert_match(/threads: expected MIN:MAX, N, auto/, e.message)
    e = assert_raises(Serval::ConfigError) { load(file: "threads 8, :auto\nthreads_auto_max 4") }
    assert_match(/threads_auto_max: must be >= the minimum given with auto \(8, config/, e.message)
    e = assert_raises(Serval::ConfigError) { load(file: "threads :auto\ntiming false") }
    assert_match(/threads: auto needs timing/, e.message)
    e = assert_raises(Serval::ConfigError) { load(file: "max_io_threads 2\ntiming false") }
    assert_match(/max_io_threads: the I\/O lane measures/, e.message)
    e = assert_raises(Serval::ConfigError) { load(argv: %w[--max-io-threads -1]) }
    assert_match(/max_io_threads: must be >= 0/, e.message)
    e = assert_raises(Serval::ConfigError) { load(argv: %w[--auto-interval 0]) }
    assert_match(/auto_interval: must be >= 0.05/, e.message)
    e = assert_raises(Serval::ConfigError) { load(env: { "RAILS_MAX_THREADS" => "automatic" }) }
    assert_match(/RAILS_MAX_THREADS: expected an integer/, e.message)
  end

  # A stock database.yml sizes the pool from RAILS_MAX_THREADS: before the
  # app loads, "auto" becomes threads_auto_max (not "auto".to_i = 0).
  def test_rails_max_threads_auto_is_exported_as_the_most_auto_may_run
    require "serval/launcher"
    env = { "RAILS_MAX_THREADS" => "auto", "MAX_THREADS" => "7" }
    opts = load(env: env, file: "threads_auto_max 12")
    log = StringIO.new
    Serval::Launcher::Support.export_auto_threads(opts, Serval::LogWriter.new(stdout: log, stderr: log), env)
    assert_equal({ "RAILS_MAX_THREADS" => "12", "MAX_THREADS" => "7" }, env)
    assert_match(/RAILS_MAX_THREADS=auto: the app sees RAILS_MAX_THREADS=12 \(threads_auto_max\)/, log.string)
    # a number, or auto given elsewhere, leaves the environment alone
    env = { "RAILS_MAX_THREADS" => "auto" }
    Serval::Launcher::Support.export_auto_threads(load(argv: %w[-t 3]), Serval::LogWriter.new(stdout: log, stderr: log), env)
    assert_equal({ "RAILS_MAX_THREADS" => "auto" }, env)
  end

  # A config file that loads the app on its first line (database.yml sizes
  # its pool from RAILS_MAX_THREADS) never sees "auto", and Rails' stock
  # `threads n, n` of that variable still means auto; WEB_CONCURRENCY=auto
  # is the processor count by then.
  def test_auto_variables_are_numbers_before_the_config_file_runs
    file = <<~RUBY
      raise "the app saw RAILS_MAX_THREADS=auto" if ENV["RAILS_MAX_THREADS"] == "auto"
      raise "the app saw WEB_CONCURRENCY=auto" if ENV["WEB_CONCURRENCY"] == "auto"
      count = ENV.fetch("RAILS_MAX_THREADS", 3)
      threads count, count
    RUBY
    saved = ENV.to_h.slice("RAILS_MAX_THREADS", "WEB_CONCURRENCY")
    ENV.update("RAILS_MAX_THREADS" => "auto", "WEB_CONCURRENCY" => "auto") # the file reads the real ENV
    opts = load(env: ENV, file: file)
    assert opts[:threads_auto]
    assert_equal "16", ENV["RAILS_MAX_THREADS"]
    assert_equal Etc.nprocessors.to_s, ENV["WEB_CONCURRENCY"]
    assert_equal Etc.nprocessors, opts[:workers]
    env = { "RAILS_MAX_THREADS" => "auto" }
    assert_equal "8", (load(env: env, argv: %w[-t auto:8 -C -]) && env["RAILS_MAX_THREADS"])
    # without auto in the environment, a count is a count
    ENV["RAILS_MAX_THREADS"] = "16"
    refute load(env: ENV, file: file)[:threads_auto]
  ensure
    %w[RAILS_MAX_THREADS WEB_CONCURRENCY].each { |k| saved&.key?(k) ? ENV[k] = saved[k] : ENV.delete(k) }
  end
end
