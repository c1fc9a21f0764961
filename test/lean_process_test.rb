# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require_relative "support/http_wire"
require_relative "support/model_gate"
require "json"
require "serval/launcher"

# Lean by default: a default process runs its main thread, the event loop
# ("serval-io"), the request threads ("serval-worker-N") and one measuring
# thread (the CPU sampler "serval-cpu", with the GVL hook: Ruby >= 3.2);
# "serval-fair", the GVL time slice's ticker, only when fair_timeslice is
# on by default. Nothing
# else - no watcher, error-log, advice or balancer thread, no child process -
# until a feature that needs one starts. And Ruby's M:N threads are refused.
class LeanProcessTest < Minitest::Test
  include Serval::SubprocessHelpers
  include Serval::HttpWire

  # Ruby's view (Thread.list names) and the kernel's (every native thread's
  # comm), and this process's children.
  APP = <<~'RUBY'
    require "json"
    run lambda { |_env|
      native = Dir["/proc/self/task/*/comm"].filter_map { |f| File.read(f).strip rescue nil }
      children = Dir["/proc/self/task/*/children"].flat_map { |f| File.read(f).split rescue [] }
      body = JSON.generate(pid: Process.pid, ruby: Thread.list.map(&:name), native: native, children: children,
                           unnamed: File.read("/proc/self/task/#{Process.pid}/comm").strip)
      [200, { "content-type" => "application/json" }, [body]]
    }
  RUBY

  RUBY_THREAD = /\Aserval-worker-\d+\z/
  NATIVE = /\A(serval-io|serval-cpu|serval-fair|serval-worker-\d+)\z/

  def threads_of(server)
    JSON.parse(http(server.port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout: 10).body,
               symbolize_names: true)
  end

  # children: the pids of the child processes it may have.
  def assert_lean(seen, children: [])
    others = seen[:ruby].reject { |name| name.nil? || name.match?(RUBY_THREAD) }
    assert_empty others, "Ruby threads beyond main and the request threads: #{seen.inspect}"
    assert_equal 1, seen[:ruby].count(&:nil?), seen.inspect # the main thread
    # the main thread and Ruby's own timer thread (3.3) keep the executable's name
    unnamed, named = seen[:native].partition { |name| name == seen[:unnamed] }
    assert_operator unnamed.size, :<=, 2, seen.inspect
    assert_empty named.reject { |name| name.match?(NATIVE) }, "native threads: #{seen.inspect}"
    assert_includes named, "serval-io"
    assert_equal (RUBY_VERSION >= "3.2" ? 1 : 0), named.count("serval-cpu"), seen.inspect
    fair = Serval::Configuration::DEFAULTS[:fair_timeslice].to_f.positive? ? 1 : 0 # fair_timeslice's default
    assert_equal fair, named.count("serval-fair"), seen.inspect
    assert_equal children.map(&:to_s), seen[:children], "child processes: #{seen.inspect}"
  end

  def test_a_default_single_mode_process
    server = spawn_server(["-b", "tcp://127.0.0.1:0"], files: { "config.ru" => APP }).boot
    seen = threads_of(server)
    assert_equal server.pid, seen[:pid]
    assert_lean(seen)
  end

  def test_a_default_cluster_worker
    server = spawn_server(["-b", "tcp://127.0.0.1:0", "-w", "1"], files: { "config.ru" => APP }).boot
    server.wait_for(/Worker 0 \(PID: \d+\) booted/)
    seen = threads_of(server)
    refute_equal server.pid, seen[:pid], "a worker answered"
    assert_lean(seen)
  end

  # The advice log (advice_log_interval, on by default; 1 s here) checks
  # from the supervising loop: while a check is in flight in its model child
  # (held at a gate by test/support/gated_model_child.rb) there is no
  # advice thread, the loop serves a command (a thread dump), and a stop is
  # prompt, the child ended with the process.
  ADVICE_CONFIG = <<~'RUBY'
    advice_log_interval 1
    require "serval/advice_log"
    require "serval/auto/model_process"
    Serval::AdviceLog.prepend(Module.new do
      def start
        @runner ||= Serval::Auto::ModelProcess.new(child: ENV.fetch("SERVAL_TEST_MODEL_CHILD"))
        super
      end
    end)
  RUBY

  def test_an_advice_check_in_flight_adds_no_thread
    gate = ModelGate.new(open: false) # shut: the checks pass at once
    server = spawn_server(["-b", "tcp://127.0.0.1:0"],
                          files: { "config.ru" => APP, "config/serval.rb" => ADVICE_CONFIG },
                          env: { "SERVAL_TEST_MODEL_CHILD" => ModelGate::CHILD, "SERVAL_TEST_MODEL_GATE" => gate.path }).boot
    client = connect(server.port)
    800.times do
      client.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
      assert_equal 200, client.read_response.status
    end
    client.close
    server.wait_for(/\Aadvice: \d+ threads/, timeout: 60) # enough requests: the line
    gate.open
    held, child = gate.accept # the next check, in flight
    seen = threads_of(server)
    assert_lean(seen, children: [child])
    server.signal(Serval::Signals::DUMP_SIGNAL)
    server.wait_for(/\Aserval\[#{server.pid}\] thread /, stream: :err) # served by the loop meanwhile
    refute_match(/thread serval-advice/, server.stderr)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    server.signal("TERM")
    status = server.wait(10)
    refute_nil status, "it did not exit while its model child was held"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    assert_equal 0, status.exitstatus
    assert_raises(Errno::ESRCH) { Process.kill(0, child) }
    refute_match(/advice failed/, server.stdout + server.stderr)
  ensure
    held&.close
    gate&.close
  end

  # In cluster mode the master asks every worker for its window without
  # waiting (Cluster#window_later): a worker listed in
  # SERVAL_TEST_GATED_WORKERS answers only once the test lets it (at the
  # gate SERVAL_TEST_WINDOW_GATE, ModelGate's protocol), and the master
  # gives a worker SERVAL_TEST_GRACE seconds.
  CLUSTER_ADVICE_CONFIG = <<~'RUBY'
    advice_log_interval 1
    require "socket"
    require "serval/cluster"
    module GatedWindow
      def window
        socket = UNIXSocket.new(ENV.fetch("SERVAL_TEST_WINDOW_GATE"))
        socket.write("#{Process.pid}\n")
        socket.gets
        socket.close
        super
      end
    end
    before_worker_boot do |index|
      Serval::Server.prepend(GatedWindow) if ENV.fetch("SERVAL_TEST_GATED_WORKERS").split(",").include?(index.to_s)
    end
    Serval::Cluster.prepend(Module.new do
      def window_later(timeout = Float(ENV.fetch("SERVAL_TEST_GRACE")), &block) = super
    end)
  RUBY

  def cluster_advice_server(gate, gated:, grace:, args: [])
    spawn_server(["-b", "tcp://127.0.0.1:0", "-w", "2", *args],
                 files: { "config.ru" => APP, "config/serval.rb" => CLUSTER_ADVICE_CONFIG },
                 env: { "SERVAL_TEST_WINDOW_GATE" => gate.path, "SERVAL_TEST_GATED_WORKERS" => gated,
                        "SERVAL_TEST_GRACE" => grace.to_s }).boot
  end

  # The master's native threads: its main thread and Ruby's timer thread
  # (3.3) keep the executable's name; nothing else.
  def assert_lean_master(pid)
    comms = Dir["/proc/#{pid}/task/*/comm"].filter_map { |f| File.read(f).strip rescue nil }
    main = File.read("/proc/#{pid}/task/#{pid}/comm").strip
    unnamed, named = comms.partition { |name| name == main }
    assert_empty named, "the master's native threads: #{comms.inspect}"
    assert_operator unnamed.size, :<=, 2, comms.inspect
  end

  # The check waits for the workers' windows (held at the gate): the
  # master runs no thread for it, its loop serves a signal (a thread dump),
  # the workers serve, and a stop is prompt.
  def test_a_cluster_advice_check_in_flight_adds_no_master_thread
    gate = ModelGate.new
    server = cluster_advice_server(gate, gated: "0,1", grace: 600)
    held = [gate.accept] # a worker asked (the first check may come before the other booted): the check waits for it
    assert_lean_master(server.pid)
    3.times { refute_equal server.pid, threads_of(server)[:pid] } # the workers serve
    server.signal(Serval::Signals::DUMP_SIGNAL)
    server.wait_for(/\Aworker \d \[\d+\] thread /, stream: :err) # the master's dump is whole: it signals the workers after it
    threads = server.stderr.scan(/^master \[#{server.pid}\] thread (\S+)/).flatten
    assert_equal ["thread-0"], threads, "the master's Ruby threads: only main (#{server.stderr})"
    assert_lean_master(server.pid)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    server.signal("TERM")
    status = server.wait(10)
    refute_nil status, "it did not exit while its workers' windows were held"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    assert_equal 0, status.exitstatus
    refute_match(/advice failed|watch failed|periodic job failed/, server.stdout + server.stderr)
  ensure
    held&.each { |socket, _| socket.close }
    gate&.close
  end

  # Worker 1 never answers: each check gives it up after the grace (the
  # next check asks it again) and logs the line from worker 0's window.
  def test_a_worker_that_never_answers_is_given_up_and_the_line_logged
    gate = ModelGate.new
    server = cluster_advice_server(gate, gated: "1", grace: 0.5)
    held = [gate.accept] # the first check asked worker 1
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 15
    until server.stdout.match?(/^advice: \d+ threads/)
      flunk "no advice line in 15 s: #{server.stdout}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      100.times { assert_equal 200, http(server.port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout: 10).status }
    end
    held << gate.accept # a later check asked it again: the first was given up
    assert_equal 1, held.map(&:last).uniq.size, "only worker 1 waits at the gate"
    assert_lean_master(server.pid)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    server.signal("TERM")
    refute_nil server.wait(10), "it did not exit"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5
    refute_match(/advice failed|watch failed|periodic job failed/, server.stdout + server.stderr)
  ensure
    held&.each { |socket, _| socket.close }
    gate&.close
  end

  # The control app's window (its own thread, waiting for the answers)
  # while the loop's check is asking: it takes its turn on the channels
  # and answers from both workers.
  def test_the_control_apps_window_while_a_check_asks
    gate = ModelGate.new
    server = cluster_advice_server(gate, gated: "0,1", grace: 600,
                                   args: ["--control-url", "unix://ctl.sock", "--control-token", "t"])
    server.wait_for(/\* Control app on unix:/)
    held, = gate.accept # the check's ask, held
    control = Thread.new do
      socket = UNIXSocket.new(File.join(server.dir, "ctl.sock"))
      socket.write("GET /window?token=t HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
      socket.read
    ensure
      socket&.close
    end
    gate.release(held)
    passing = Thread.new { loop { gate.release(gate.accept.first) } } # every later ask passes
    head, body = control.value.split("\r\n\r\n", 2)
    assert_match(%r{\AHTTP/1\.1 200}, head, body)
    window = JSON.parse(body)
    assert_equal 2, window["processes"], body[0, 300]
    assert_empty window["missing"]
  ensure
    passing&.kill
    gate&.close
  end

  def test_m_n_threads_are_refused_at_boot
    skip "RUBY_MN_THREADS needs Ruby >= 3.3" if RUBY_VERSION < "3.3"

    server = spawn_server(["-b", "tcp://127.0.0.1:0"], env: { "RUBY_MN_THREADS" => "1" }).start
    server.wait_for(/\Aserval: RUBY_MN_THREADS=1 \(Ruby's M:N threads\) is not supported: .* Unset RUBY_MN_THREADS /,
                    stream: :err, timeout: 30)
    status = server.wait(30)
    refute_nil status, "it did not exit"
    assert_equal 1, status.exitstatus
    refute_match(/Listening on/, File.read(server.stdout_path), "refused before binding")
  end

  def test_the_refusal_reads_ruby_description
    assert_nil Serval::Launcher::Support.refuse_mn_threads("ruby 3.3.8 (2025-04-09 revision b200bad6cd) [x86_64-linux]")
    err = assert_raises(Serval::ConfigError) do
      Serval::Launcher::Support.refuse_mn_threads("ruby 3.3.8 (2025-04-09 revision b200bad6cd) +YJIT +MN [x86_64-linux]")
    end
    assert_match(/RUBY_MN_THREADS/, err.message)
  end
end
