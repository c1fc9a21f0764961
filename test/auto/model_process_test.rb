# frozen_string_literal: true

require "json"
require "test_helper"
require "serval/auto/model"
require "serval/auto/model_process"
require "support/model_gate"

# The model's child process: the same answer as in this process, at nice
# 19 and (Linux) SCHED_IDLE, restarted after it dies, gone after #stop.
class AutoModelProcessTest < Minitest::Test
  WINDOW = File.expand_path("../fixtures/auto/window-35.json", __dir__)

  def setup
    @window = JSON.parse(File.read(WINDOW))
    @process = Serval::Auto::ModelProcess.new(timeout: 60)
  end

  def teardown
    @process.stop
  end

  def test_the_child_answers_what_the_model_gives_here_at_the_lowest_priority
    options = { max: 8, rate: 100.0, through: 5 }
    got = @process.call(@window, **options)
    assert_equal Serval::Auto::Model.call(@window, **options), got
    assert_equal Float::INFINITY, got[:p99][0], "a count that cannot keep up"
    stat = File.read("/proc/#{@process.pid}/stat").split(") ").last.split
    assert_equal Serval::Auto::ModelProcess::NICE, stat[16].to_i
    assert_equal 5, stat[38].to_i, "the thread that runs the model is SCHED_IDLE" if RUBY_PLATFORM.include?("linux")
    assert_nil @process.call({ requests: 3, samples: [] }, max: 4), "too few requests: nil, as in-process"
  end

  # The control app's child (someone waits for its advice): nice 0 and
  # SCHED_BATCH, a fair share of a busy CPU without preempting requests.
  def test_a_batch_child_runs_at_nice_0_and_sched_batch
    batch = Serval::Auto::ModelProcess.new(timeout: 60, priority: :batch)
    refute_nil batch.call(@window, max: 4)
    stat = File.read("/proc/#{batch.pid}/stat").split(") ").last.split
    assert_equal [Process.getpriority(Process::PRIO_PROCESS, 0), 0].max, stat[16].to_i # 0 unless this runs niced
    assert_equal 3, stat[38].to_i, "the thread that runs the model is SCHED_BATCH" if RUBY_PLATFORM.include?("linux")
    assert_raises(ArgumentError) { Serval::Auto::ModelProcess.new(priority: :now) }
  ensure
    batch&.stop
  end

  def test_the_child_gives_the_advice_this_process_gives
    require "serval/advice"
    options = { machine: { cpus: 2.0, cpu_source: "test" }, sim_requests: 2000, load_requests: 2000 }
    got = @process.advice(@window, **options)
    assert got[:enough_data]
    assert_equal JSON.generate(Serval::Advice.recommend(@window, **options)), JSON.generate(got)
    assert_raises(Serval::ModelProcessError) { @process.advice({ requests: "many" }, **options) }
  end

  def test_calls_from_several_threads_take_turns
    options = { max: 4 }
    want = Serval::Auto::Model.call(@window, **options)
    got = Array.new(3) { Thread.new { @process.call(@window, **options) } }.map { |t| t.join(60).value }
    assert_equal [want] * 3, got
  end

  def test_a_dead_child_is_an_error_and_the_next_call_starts_another
    @process.call(@window, max: 4)
    first = @process.pid
    Process.kill(:KILL, first)
    Process.wait(first) rescue Errno::ECHILD # rubocop:disable Style/RescueModifier
    assert_raises(Serval::ModelProcessError) { @process.call(@window, max: 4) }
    assert_nil @process.pid
    refute_nil @process.call(@window, max: 4)
    refute_equal first, @process.pid
  end

  def test_no_answer_in_time_is_a_timeout_and_the_priority_can_be_raised
    slow = Serval::Auto::ModelProcess.new(timeout: 0.001) # the child cannot even boot in 1 ms
    assert_equal :idle, slow.priority
    assert_raises(Serval::ModelProcessTimeout) { slow.call(@window, max: 4) }
    assert_nil slow.pid, "the child that did not answer is gone"
    slow.priority = :batch
    assert_equal :batch, slow.priority
    assert_raises(ArgumentError) { slow.priority = :fast }
  ensure
    slow&.stop
  end

  def test_a_model_error_comes_back_as_an_error
    error = assert_raises(Serval::ModelProcessError) { @process.call({ requests: "many" }, max: 4) }
    assert_match(/ArgumentError/, error.message)
  end

  def test_stop_ends_the_child
    @process.call(@window, max: 4)
    pid = @process.pid
    @process.stop
    assert_nil @process.pid
    assert_raises(Errno::ESRCH, Errno::ECHILD) { Process.kill(0, pid) && Process.wait(pid) }
  end

  # ControlApp#prepare_advice: the child starts before the first call,
  # and that call is answered by it.
  def test_prestart_starts_the_child_that_the_first_call_uses
    assert_nil @process.pid
    pid = @process.prestart.pid
    assert_equal 0, Process.kill(0, pid) && 0
    nice = File.read("/proc/#{pid}/stat").split(") ").last.split[16].to_i
    assert_equal Serval::Auto::ModelProcess::NICE, nice, "niced from here at once, before the child's Ruby has booted"
    @process.prestart
    assert_equal pid, @process.pid, "started once"
    refute_nil @process.call(@window, max: 4)
    assert_equal pid, @process.pid
  end

  # A process forked from the one that started the child (a cluster
  # worker, a refork) closes its copies of the child's pipes (#forget):
  # the child then ends with its parent, not with the last fork.
  def test_a_forked_process_forgets_the_child_so_it_ends_with_its_parent
    script = <<~RUBY
      require "serval/auto/model_process"
      mp = Serval::Auto::ModelProcess.new.prestart
      kid = fork { $stdout.reopen(File::NULL); mp.forget if ENV["FORGET"] == "1"; $stdin.read; exit!(0) }
      puts "\#{mp.pid} \#{kid}"
    RUBY
    %w[1 0].each do |forget|
      rd, wr = IO.pipe
      out = IO.popen({ "FORGET" => forget }, [RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script],
                     in: rd, &:read)
      rd.close
      model, kid = out.split.map(&:to_i)
      gone = wait_gone(model, forget == "1" ? 10 : 1.5)
      assert_equal forget == "1", gone, "FORGET=#{forget}: the model's child #{gone ? 'ended' : 'lives on'} with the fork alive"
      assert process_alive?(kid), "the fork outlives its parent"
    ensure
      wr&.close # the fork reads EOF and exits
      wait_gone(kid, 10) if kid
      Process.kill(:KILL, model) if model && process_alive?(model)
    end
  end

  # #submit: the same answer without waiting, the frame in a file of its
  # own (0600) that is gone once answered.
  def test_a_submitted_request_gives_the_same_answer_without_waiting
    options = { max: 4 }
    want = Serval::Auto::Model.call(@window, **options)
    files = -> { Dir[File.join(Dir.tmpdir, "serval-model-#{Process.pid}-*")] }
    request = @process.submit(:model, @window, **options)
    file = files.call.first
    refute_nil file, "the frame is in a file"
    assert_equal 0o600, File.stat(file).mode & 0o777
    assert_nil @process.submit(:model, @window, **options), "busy: nil at once"
    assert_equal want, answer_of(request)
    assert request.done?
    assert_empty files.call, "removed once answered"
    refute_nil @process.submit(:model, @window, **options), "the next one"
  end

  # Rails sets Encoding.default_internal (config.encoding, UTF-8): the
  # frame's file is still written as bytes (the advice log's check failed
  # on every Rails app with "\xC7" from ASCII-8BIT to UTF-8).
  def test_a_submitted_request_works_with_rails_default_internal
    internal = Encoding.default_internal
    Encoding.default_internal = Encoding::UTF_8
    window = @window.merge("label" => "caf\u00e9 \u2615") # bytes above 0x7f in the frame for sure
    options = { max: 4 }
    assert_equal Serval::Auto::Model.call(window, **options), answer_of(@process.submit(:model, window, **options))
  ensure
    Encoding.default_internal = internal
  end

  # A blocking call from another thread waits for the submitted request
  # (one child, one turn at a time).
  def test_a_blocking_call_waits_for_a_submitted_request
    gate = ModelGate.new
    process = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    request = process.submit(:model, @window.merge(gate: gate.path), max: 4)
    child, = gate.accept
    caller = Thread.new { process.call(@window, max: 4) }
    assert_nil caller.join(0.2), "waits its turn"
    gate.release(child)
    refute_nil answer_of(request)
    assert_equal Serval::Auto::Model.call(@window, max: 4), caller.join(60).value
  ensure
    process&.stop
    gate&.close
  end

  # A child that does not answer: past the deadline, #poll raises the
  # timeout and stops the child; the next request starts another.
  def test_a_hung_request_times_out_and_the_next_one_works
    gate = ModelGate.new
    process = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    request = process.submit(:model, @window.merge(gate: gate.path), max: 4)
    _, hung = gate.accept
    assert_equal process.pid, hung
    assert_equal Serval::Auto::ModelProcess::Request::PENDING, request.poll
    assert_raises(Serval::ModelProcessTimeout) { request.poll(request.deadline) }
    assert_nil process.pid, "the child that did not answer is gone"
    assert request.io.closed?
    assert_raises(Errno::ESRCH) { Process.kill(0, hung) }
    assert_raises(Serval::ModelProcessError) { request.poll }
    again = process.submit(:model, @window, max: 4)
    assert_equal Serval::Auto::Model.call(@window, max: 4), answer_of(again)
  ensure
    process&.stop
    gate&.close
  end

  # #stop ends a submitted request at once: its IO closed, its poll raises.
  def test_stop_ends_a_submitted_request
    gate = ModelGate.new
    process = Serval::Auto::ModelProcess.new(timeout: 60, child: ModelGate::CHILD)
    request = process.submit(:model, @window.merge(gate: gate.path), max: 4)
    _, pid = gate.accept
    process.stop
    assert request.io.closed?
    assert request.done?
    assert_raises(Serval::ModelProcessError) { request.poll }
    assert_raises(Errno::ESRCH, Errno::ECHILD) { Process.kill(0, pid) && Process.wait(pid) }
  ensure
    gate&.close
  end

  def test_a_failing_submitted_request_raises_and_the_child_goes_on
    request = @process.submit(:model, { requests: "many" }, max: 4)
    error = assert_raises(Serval::ModelProcessError) { answer_of(request) }
    assert_match(/ArgumentError/, error.message)
    assert_equal Serval::Auto::Model.call(@window, max: 4), answer_of(@process.submit(:model, @window, max: 4))
  end

  # The samples go to the child packed by column (SampleTable): the same
  # window comes back, whatever its rows hold.
  def test_the_sample_table_gives_back_the_window
    rows = [{ run: 0.1, idle: 0.2, shape: [0.05, 0.2, 0.05], route: "GET /a" },
            { run: 0.3, idle: -0.0, lock: 0.01, shape: [], route: "GET /b" },
            { idle: Float::INFINITY, run: 0.5, shape: [0.5], route: "GET /a", odd: nil },
            { run: 1, idle: 0.0, extra: { deep: [1, "x"] } }]
    window = { requests: 4, samples: rows, route_samples: [{ route: "GET /a", run: 0.1 }], other: [1, 2] }
    packed = Serval::Auto::SampleTable.pack(window)
    assert_kind_of Serval::Auto::SampleTable::Table, packed[:samples]
    assert_equal rows, window[:samples], "the window is not changed"
    back = Serval::Auto::SampleTable.unpack(Marshal.load(Marshal.dump(packed))) # rubocop:disable Security/MarshalLoad
    assert_equal window, back
    assert_equal rows.map { |r| r.keys.sort }, back[:samples].map { |r| r.keys.sort }, "missing keys still missing"
    kinds = packed[:samples].columns.to_h { |c| [c.key, c.kind] }
    assert_equal({ run: :any, idle: :float, shape: :floats, route: :strings, lock: :float, odd: :any, extra: :any }, kinds)
    nan = Serval::Auto::SampleTable.unpack(Serval::Auto::SampleTable.pack({ samples: [{ run: Float::NAN }] }))
    assert nan[:samples].first[:run].nan?
    assert_equal({ samples: [] }, Serval::Auto::SampleTable.pack({ samples: [] }))
    assert_equal "not a window", Serval::Auto::SampleTable.pack("not a window")
  end

  # The advice log's kind: the machine's facts and the server's memory read
  # in the child, the answer the one Advice::Local gives here.
  def test_local_advice_reads_the_facts_in_the_child
    require "serval/advice/local"
    options = { sim_requests: 2000, load_requests: 2000, load_points: [], precision: false }
    request = @process.submit(:local_advice, @window, pids: [Process.pid], **options)
    got = answer_of(request)
    want = Serval::Advice::Local.recommend(@window, **options)
    stable = %i[cpus cpu_source memory_source worker_source] # memory and PSS move meanwhile
    assert_equal want[:machine].slice(*stable), got[:machine].slice(*stable)
    assert_equal "PSS of pid #{Process.pid}", got[:machine][:worker_source], "this process's memory, not the child's"
    assert_equal want.values_at(:threads, :processes), got.values_at(:threads, :processes)
    assert_raises(ArgumentError) { @process.submit(:nothing, @window) }
  end

  private

  # Waits (bounded) for the request's IO, as the supervising loop does.
  def answer_of(request, timeout: 60)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      answer = request.poll
      return answer unless answer.equal?(Serval::Auto::ModelProcess::Request::PENDING)

      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flunk "no answer in #{timeout} s" if left <= 0
      request.io.wait_readable(left)
    end
  end

  private

  # A process that is not this one's child: gone, or a zombie nobody reaps.
  def process_alive?(pid)
    state = File.read("/proc/#{pid}/stat").split(") ").last.split.first
    state != "Z"
  rescue Errno::ENOENT, Errno::ESRCH
    false
  end

  def wait_gone(pid, seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    while process_alive?(pid)
      return false if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
    true
  end
end
