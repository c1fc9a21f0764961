# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/subprocess_server"
require_relative "support/http_wire"
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

  def assert_lean(seen)
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
    assert_empty seen[:children], "child processes: #{seen.inspect}"
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
