# frozen_string_literal: true

require_relative "test_helper"
require "support/http_wire"
require "support/subprocess_server"
require "serval/launcher"

# Cluster mode through the real executable: workers, hooks, titles, config errors.
class ClusterTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  PID_APP = %(run ->(env) { [200, {"content-type" => "text/plain"}, [Process.pid.to_s]] }\n)

  HOOKS_CONFIG = <<~RUBY
    workers 2
    threads 1, 2
    bind "tcp://127.0.0.1:0"
    worker_check_interval 0.2
    log = ->(line) { File.open("hooks.log", "a") { |f| f.puts(line) } }
    before_fork { log.call("before_fork \#{Process.pid}") }
    on_worker_boot { |i| log.call("before_worker_boot \#{i} \#{Process.pid}") }
    after_worker_boot { |i| log.call("after_worker_boot \#{i} \#{Process.pid}") }
    on_worker_shutdown { |i| log.call("before_worker_shutdown \#{i} \#{Process.pid}") }
    after_worker_shutdown { |w| log.call("after_worker_shutdown \#{w.index} \#{Process.pid}") }
  RUBY

  def get(port)
    http(port, good_request("/", host: "127.0.0.1"))
  end

  def test_two_workers_serve_hooks_and_titles
    server = spawn_server(["-C", "config/serval.rb"], files: { "config.ru" => PID_APP, "config/serval.rb" => HOOKS_CONFIG }).boot
    pids = 2.times.map { |i| server.wait_for(/Worker #{i} \(PID: (\d+)\) booted/)[1].to_i }
    seen = Array.new(20) { get(server.port).body.to_i }
    assert(seen.all? { |pid| pids.include?(pid) }, "answers came from #{seen.uniq} not workers #{pids}")
    refute_includes seen, server.pid

    # no tag given: the directory's name, as Puma; the kernel keeps as much
    # of a title as the process's original command line had room for
    master_title = File.read("/proc/#{server.pid}/cmdline").split("\0").first
    full = "serval #{Serval::VERSION} (tcp://127.0.0.1:0) cluster: 2/2 workers [#{File.basename(server.dir)}]"
    assert full.start_with?(master_title), "#{master_title.inspect} is the start of #{full.inspect}"
    assert_operator master_title.size, :>=, full.index(" ["), "the worker counts come before the tag"
    server.wait_for(/Worker 1 .*booted/)
    deadline = Time.now + 5
    title = nil
    until Time.now > deadline
      title = File.read("/proc/#{pids[0]}/cmdline")
      break if title.include?("threads busy")

      sleep 0.05
    end
    assert_match(%r{\Aserval: worker 0 \d+/2 threads busy, \d+ requests}, title)

    server.stop
    assert server.status.success?, server.logs
    hooks = File.readlines(File.join(server.dir, "hooks.log"), chomp: true)
    assert_equal ["before_fork #{server.pid}"], hooks.grep(/before_fork/)
    pids.each_with_index do |pid, i|
      assert_includes hooks, "before_worker_boot #{i} #{pid}"
      assert_includes hooks, "before_worker_shutdown #{i} #{pid}"
      assert_includes hooks, "after_worker_boot #{i} #{server.pid}"
      assert_includes hooks, "after_worker_shutdown #{i} #{server.pid}"
    end
  end

  def test_bad_workers_value_fails_at_boot_naming_the_option
    server = spawn_server(["-w", "many", "-b", "tcp://127.0.0.1:0"]).start
    assert server.wait(10), "did not exit"
    refute server.status.success?
    assert_match(/workers: expected an integer or :auto, got "many"/, server.stderr)
  end

  def test_hook_with_wrong_arity_fails_at_boot_naming_the_hook
    config = "workers 2\nbind 'tcp://127.0.0.1:0'\nbefore_worker_boot { |a, b| }\n"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => PID_APP, "c.rb" => config }).start
    assert server.wait(10), "did not exit"
    refute server.status.success?
    assert_match(/c\.rb:3: before_worker_boot: the block must take 1 argument \(the worker index\), it takes 2/, server.stderr)
  end

  def test_workers_auto_and_validation
    opts = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(workers: :auto))
    assert_equal Etc.nprocessors, opts[:workers]
    err = assert_raises(Serval::ConfigError) { Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(workers: -1)) }
    assert_match(/\Aworkers: must be >= 0/, err.message)
    err = assert_raises(Serval::ConfigError) do
      Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(worker_timeout: 2, worker_check_interval: 5))
    end
    assert_match(/\Aworker_timeout \(2\.0\) must be > worker_check_interval/, err.message)
    err = assert_raises(Serval::ConfigError) do
      Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(before_fork: [->(_x) {}]))
    end
    assert_match(/\Abefore_fork: the block must take 0 arguments, it takes 1/, err.message)
  end

  # Launcher#stats in cluster mode: one entry per worker with its Server#stats.
  def test_stats_in_process
    options = Serval::Configuration.finish(Serval::Configuration::DEFAULTS.merge(
                                             binds: ["tcp://127.0.0.1:0"], workers: 2, worker_check_interval: 0.1
                                           ))
    out = StringIO.new
    launcher = Serval::Launcher.new(options, log_writer: Serval::LogWriter.new(stdout: out, stderr: out),
                                             app: ->(_env) { [200, {}, ["ok"]] }, signals: false)
    thread = Thread.new { launcher.run }
    assert launcher.wait_until_booted(10), out.string
    deadline = Time.now + 10
    sleep 0.05 until launcher.stats[:booted_workers] == 2 || Time.now > deadline
    stats = launcher.stats
    assert_equal 2, stats[:workers]
    assert_equal 0, stats[:phase]
    assert_equal [0, 1], stats[:worker_status].map { |w| w[:index] }
    status = stats[:worker_status].first
    assert status[:booted]
    assert_kind_of Integer, status[:pid]
    assert_equal 5, status[:last_status][:max_threads]
    assert_includes status[:last_status].keys, :requests_count
    traces = launcher.thread_backtraces
    assert_includes traces[:master][:threads].keys.join, "(run)"
    assert_equal stats[:worker_status].map { |w| w[:pid] }, traces[:workers].map { |w| w[:pid] }
    traces[:workers].each { |w| refute_empty w[:threads], "worker #{w[:index]} answered with its threads" }
    launcher.stop
    assert_equal 0, thread.value
  end

  # A signal that reaches a worker just forked, before it installs its own
  # handlers, runs the master's inherited handler in the worker. It used to
  # write into the master's signal pipe: a TERM for a worker starting (TTIN
  # then TTOU, a phased restart) stopped the master. The worker now keeps it
  # and acts on it itself. The first worker fork here TERMs itself at once.
  def test_a_term_that_reaches_a_worker_as_it_starts_stops_that_worker_only
    config = <<~RUBY
      workers 2
      threads 1, 1
      bind "tcp://127.0.0.1:0"
      worker_check_interval 0.2
      Process.singleton_class.prepend(Module.new do
        def _fork
          pid = super
          if pid.zero? && !File.exist?("termed")
            File.write("termed", Process.pid.to_s)
            Process.kill(:TERM, Process.pid) # the trap in place now is the master's
          end
          pid
        end
      end)
    RUBY
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => PID_APP, "c.rb" => config }).boot
    termed = server.wait_for(/Worker \d \(PID: (\d+)\) booted/) && File.read(File.join(server.dir, "termed")).to_i
    server.wait_for(/Worker \d \(PID: #{termed}\) exited/, stream: :err, timeout: 10)
    # the other one and the replacement boot (the TERMed one may or may not log its own boot first)
    server.wait_for_count(/Worker \d \(PID: (?!#{termed}\))\d+\) booted/, 2, timeout: 10)
    assert_equal 200, get(server.port).status
    refute_match(/Gracefully stopping/, server.stdout, "the master went on")
  end

end
