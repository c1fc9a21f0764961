# frozen_string_literal: true

require "serval/supervisor"
require "serval/cluster/worker_handle"
require "serval/cluster/worker"
require "serval/cluster/command_channel"
require "serval/cluster/load_table"
require "serval/cluster/recycler"
require "serval/cluster/refork"

module Serval
  # Cluster mode: a master that serves nothing. It binds, (pre)loads the app,
  # forks `workers` Worker processes and supervises them from one loop that
  # handles commands (signals, #enqueue), worker check-ins, exits and deadlines.
  # Boot, the common commands, restart and cleanup are Supervisor's. (Every
  # file under cluster/ names the superclass too, so any of them may be
  # loaded first.)
  class Cluster < Supervisor
    include Refork

    MODE = "cluster"
    SIGNALS = Signals::MASTER
    BACKOFF_MAX = 30.0        # seconds between respawns of a crash-looping worker
    HEALTHY_AFTER = 10.0      # a worker up this long resets its crash count
    STOP_GRACE = 5.0          # after drain_timeout, stopping workers get KILL
    LOAD_MAX_AGE = 2.0        # seconds: an older LoadTable slot is a worker that stopped measuring

    def initialize(options, **)
      super
      @wanted = options[:workers]
      @preload = options[:preload_app].nil? ? @wanted > 1 : options[:preload_app]
      @workers = {}          # index => WorkerHandle serving (or booting)
      @replacing = {}        # index => the worker still serving while its replacement (in @workers) boots
      @retiring = []         # handles told to stop
      @phase = 0
      @failures = Hash.new(0)
      @spawn_at = Hash.new(0.0)
      @asker = CommandChannel::Asker.new
      @recycled = Hash.new(0) # why => count (worker_max_requests, worker_max_memory, replace_me)
      @recycler = Recycler.new(max_requests: options[:worker_max_requests], jitter: options[:worker_max_requests_jitter],
                               max_memory: options[:worker_max_memory], interval: options[:worker_check_interval])
      @unknown_exits = {} # pid => status of a reaped child not (yet) known as a worker (a mold's fork)
      refork_setup
    end

    def stats
      handles = @workers.values.sort_by(&:index)
      { started_at: @started_at, workers: handles.size, phase: @phase,
        booted_workers: handles.count(&:booted?), old_workers: handles.count { |h| h.phase != @phase },
        workers_recycled: @recycled.values.sum, workers_recycled_by: @recycled.dup,
        worker_status: handles.reject { |h| h.equal?(@mold) }.map(&:stats), **refork_stats }
    end

    # A GVL trace of every booted worker, recorded at the same time and merged
    # (one process per worker) as JSON text; workers that did not answer are
    # listed in otherData.missing. Called from the control app's thread.
    def gvl_trace(seconds)
      require "serval/gvl_trace"
      GVLTrace.check_supported
      origin = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
      answers, missing = ask_workers(:trace, seconds + CommandChannel::GRACE, seconds: seconds, origin_ns: origin)
      GVLTrace.merge(answers, missing)
    end

    # Every booted worker's rolling window, asked at once and merged
    # (Timing::Window.merge) with processes, per_process and missing.
    def window
      require "serval/timing"
      merge_windows(*ask_workers(:window, CommandChannel::GRACE))
    end

    private def merge_windows(answers, missing)
      windows = answers.map { |a| a[:result] }.compact
      Timing::Window.merge(windows).merge(
        processes: windows.size, missing: missing,
        per_process: answers.map { |a| { index: a[:index], pid: a[:pid], requests: a[:result]&.fetch(:requests, 0) } }
      )
    end

    # The same window without waiting, from the loop (a job, Supervisor#every):
    # every booted worker asked at once, each channel watched (Supervisor#watch),
    # the answers read as the loop sees them. The block gets the merged window
    # on the loop once every worker answered or failed, or `timeout` passed
    # (Supervisor#after): the workers that did not answer are missing. Returns
    # the Asking (#cancel ends it unanswered), or nil when the channels are
    # busy with another ask (the control app's): no block then.
    def window_later(timeout = CommandChannel::GRACE, &block)
      require "serval/timing"
      ask_workers_later(:window, timeout) { |answers, missing| block.call(merge_windows(answers, missing)) }
    end

    # What load balancers are told (Serval::Capacity), from the workers'
    # LoadTable slots; called from the agent-check and metrics threads.
    def capacity
      require "serval/capacity"
      serving = @workers.values.select(&:booted?) # a snapshot: this runs off the supervise loop
      pids = serving.map(&:pid)
      entries = @load_table && !@load_table.closed? ? @load_table.read(max_age: LOAD_MAX_AGE) : []
      entries = entries.select { |e| pids.include?(e.pid) && !e.stopping }
      state = if @stopping then :stopping
              elsif !booted? || serving.empty? then :booting
              elsif entries.any?(&:shedding) then :shedding
              else :ready
              end
      Capacity.new(state: state, entries: entries)
    end

    # The master's threads and every booted worker's.
    def thread_backtraces
      answers, missing = ask_workers(:backtraces, CommandChannel::GRACE)
      { master: { pid: Process.pid, threads: Launcher::Support.thread_backtraces },
        workers: answers.map { |a| { index: a[:index], pid: a[:pid], threads: a[:result] } },
        missing: missing }
    end

    private

    def start
      @options[:before_fork].each(&:call)
      @load_table = LoadTable.create(@options[:tmpdir]) # shared with every worker forked from here
      maintain
    end

    # The one loop: commands, check-ins, exits (SIGCHLD's :child only wakes
    # it), deadlines, worker count, watched IOs (Supervisor#watch).
    def supervise
      @last_tick = now
      until @done
        ready = select_ready([@signals.reader, *handles.map(&:status_io).reject(&:closed?), *watched_ios], next_timeout)
        guard_suspend
        (ready || []).each do |io|
          if io == @signals.reader
            @signals.read.each { |command| handle(command) }
          elsif (worker = handles.find { |h| h.status_io == io })
            read_worker(worker)
          end
        end
        run_watches(ready) unless @done
        reap
        check_deadlines
        @stopping ? finish_stop : maintain
        run_jobs unless @done
      end
    end

    def on_add_worker = change_count(@wanted + 1)
    def on_remove_worker = change_count(@wanted - 1)

    def forward(signal)
      handles.each { |h| h.signal(signal) }
    end

    def process_label = "master [#{Process.pid}]"

    def handles
      [*@workers.values, *@replacing.values, *@retiring, *@mold]
    end

    def ask_workers(command, timeout, **args)
      targets = @workers.values.select(&:booted?).sort_by(&:index) # a snapshot: this runs off the supervise loop
      @asker.ask(targets, command, timeout, **args)
    end

    # Asker#start on the loop: the block gets [answers, missing] once done.
    def ask_workers_later(command, timeout, **args, &done)
      targets = @workers.values.select(&:booted?).sort_by(&:index)
      asking = @asker.start(targets, command, timeout, **args) or return nil
      finish = -> { done.call(*asking.result) unless asking.ended? }
      watches = asking.ios.map { |io| watch(io) { finish.call if asking.read(io) } }
      timer = after([asking.deadline - now, 0.001].max) { finish.call }
      asking.on_end do # its #result or #cancel
        watches.each(&:stop)
        timer.stop
      end
      finish.call if asking.done? # nobody to ask
      asking
    rescue StandardError
      asking&.cancel
      raise
    end

    def read_worker(handle)
      return unless handle

      case handle.read(now)
      when :booted
        @log_writer.info(format("- Worker %<i>d (PID: %<p>d) booted in %<s>.2fs, phase: %<ph>d",
                                i: handle.index, p: handle.pid, s: handle.booted_at - handle.spawned_at, ph: handle.phase))
        @options[:after_worker_boot].each { |hook| hook.call(handle.index) }
        announce_ready if @workers.values.all?(&:booted?) && @workers.size == @wanted
        update_title
      when :eof then handle.status_io.close unless handle.status_io.closed?
      end
    end

    def reap
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        break unless pid

        handle = handles.find { |h| h.pid == pid }
        unless handle
          @unknown_exits.shift while @unknown_exits.size >= 64
          @unknown_exits[pid] = status # a worker the mold forked may exit before its pid is known
          next
        end

        exited(handle, status)
      end
    rescue Errno::ECHILD
      nil
    end

    # A reaped worker (or the mold): forgotten, logged, respawned later by
    # maintain unless it was told to stop.
    def exited(handle, status)
      pid = handle.pid
      handle.exit_status = status
      handle.close
      @retiring.delete(handle)
      @recycler&.forget(pid)
      return if mold_exited(handle)

      @workers.delete(handle.index) if @workers[handle.index].equal?(handle)
      @replacing.delete(handle.index) if @replacing[handle.index].equal?(handle)
      if handle.stopping?
        @log_writer.info("- Worker #{handle.index} (PID: #{pid}) stopped (#{describe(status)})")
      elsif !@stopping
        crashed(handle)
      end
      @options[:after_worker_shutdown].each { |hook| hook.call(handle) }
      update_title
    end

    # Exponential backoff per worker index: the first respawn is immediate,
    # then 0.5 s, 1 s, 2 s ... up to BACKOFF_MAX; one log line per respawn.
    def crashed(handle)
      i = handle.index
      healthy = handle.booted? && now - handle.booted_at >= HEALTHY_AFTER
      @failures[i] = healthy ? 1 : @failures[i] + 1
      delay = @failures[i] <= 1 ? 0.0 : [0.5 * (2**(@failures[i] - 2)), BACKOFF_MAX].min
      @spawn_at[i] = now + delay
      @log_writer.error(format("! Worker %<i>d (PID: %<p>d) exited (%<st>s); respawning in %<d>.1fs (failure %<f>d in a row)",
                               i: i, p: handle.pid, st: describe(handle.exit_status), d: delay, f: @failures[i]))
    end

    def describe(status)
      return "unknown" unless status
      return "signal #{Signal.signame(status.termsig)}" if status.signaled?

      "status #{status.exitstatus}"
    end

    def check_deadlines
      t = now
      (@workers.values + @replacing.values).each do |h|
        next if h.stopping? || t <= h.deadline(@options)

        what = h.booted? ? "no check-in for #{@options[:worker_timeout]}s" : "not booted after #{@options[:worker_boot_timeout]}s"
        @log_writer.error("! Worker #{h.index} (PID: #{h.pid}) timed out (#{what}); killing it")
        h.signal("KILL")
        h.excuse(@options[:worker_timeout]) # one KILL per deadline; reap replaces it
      end
      @retiring.each do |h|
        h.signal("KILL") if h.stop_sent_at && t > h.stop_sent_at + @options[:drain_timeout] + STOP_GRACE
      end
    end

    # The master did not run for a while (suspend, SIGSTOP): excuse everyone.
    def guard_suspend
      t = now
      gap = t - @last_tick
      @last_tick = t
      return unless gap > @options[:worker_timeout] / 2

      @log_writer.info(format("- Master was not running for %.1fs; worker deadlines extended", gap))
      handles.each { |h| h.excuse(gap) }
    end

    def next_timeout
      deadlines = @workers.values.map { |h| h.deadline(@options) }
      deadlines.concat(@spawn_at.values.select { |at| at > now })
      [[*deadlines.map { |d| d - now }, @options[:worker_check_interval], jobs_timeout].compact.min, 0.01].max
    end

    def maintain
      @options[:worker_culling_strategy] == :oldest ? maintain_oldest : maintain_youngest
      step_phased_restart
      step_recycle
      step_refork
    end

    # :youngest (the default): workers 0...wanted; fewer wanted stops the
    # highest indexes, the ones added last.
    def maintain_youngest
      @wanted.times do |i|
        spawn_worker(i) if !@workers.key?(i) && now >= @spawn_at[i]
      end
      @workers.keys.select { |i| i >= @wanted }.each { |i| retire(@workers[i]) }
    end

    # :oldest (Puma's worker_culling_strategy): fewer wanted stops the
    # workers that have run longest; a missing worker takes the lowest index
    # no worker (running or stopping) holds.
    def maintain_oldest
      retire(@workers.values.min_by(&:spawned_at)) while @workers.size > @wanted
      taken = handles.reject { |h| h.equal?(@mold) }.map(&:index)
      (@wanted - @workers.size).times do
        index = (0..).find { |i| !taken.include?(i) }
        taken << index
        spawn_worker(index) if now >= @spawn_at[index]
      end
    end

    def change_count(count)
      return @log_writer.info("- Keeping 1 worker (TTOU stops at one)") if count < 1

      @wanted = count
      @log_writer.info("- Workers: #{@wanted}")
      update_title
    end

    # USR1: one old worker at a time, once every current worker is booted.
    def on_phased_restart
      @phase += 1
      end_mold # workers fork from the master again (without preload_app, with the new code)
      @log_writer.info("- Phased restart to phase #{@phase}#{@preload ? ' (preloaded: app code is not reloaded)' : ''}")
    end

    def step_phased_restart
      return unless @workers.size == @wanted && @workers.values.all?(&:booted?)

      old = @workers.values.find { |h| h.phase != @phase }
      retire(old) if old
    end

    # worker_max_requests / worker_max_memory / replace_me: one worker at a
    # time, only while every wanted worker is booted and none is stopping or
    # being replaced. Its replacement boots first while it keeps serving;
    # then it drains (step_replaced).
    def step_recycle
      step_replaced
      return if @stopping || !@retiring.empty? || !@replacing.empty?
      return unless @workers.size == @wanted && @workers.values.all?(&:booted?)

      t = now
      @workers.values.sort_by(&:index).each do |h|
        kind, why = @recycler.reason(h.pid, h.last_status, t)
        next unless kind

        @recycled[kind] += 1
        @log_writer.info("- Worker #{h.index} (PID: #{h.pid}) recycled: #{why}; starting its replacement")
        @replacing[h.index] = @workers.delete(h.index)
        spawn_worker(h.index)
        return
      end
    end

    # A replaced worker leaves once its replacement has booted (or at a stop).
    def step_replaced
      @replacing.each_value.select { |old| @stopping || @workers[old.index]&.booted? }.each do |old|
        @replacing.delete(old.index)
        retire(old)
      end
    end

    def retire(handle)
      @workers.delete(handle.index) if @workers[handle.index].equal?(handle)
      @retiring << handle
      handle.stop_sent_at = now
      @log_writer.info("- Stopping worker #{handle.index} (PID: #{handle.pid})")
      handle.signal("TERM") # the worker runs before_worker_shutdown on it
    end

    # From the mold when one is ready (fork_worker), else from here; a
    # worker whose mold is still draining waits for it.
    def spawn_worker(index)
      return if mold_pending?

      status_r, status_w = IO.pipe
      control_m, control_w = CommandChannel.pair
      others = handles.flat_map { |h| [h.status_io, h.control_io] }
      @options[:before_worker_fork].each do |hook|
        hook.call(index)
      rescue StandardError => e
        @log_writer.exception(e, "serval: before_worker_fork hook failed")
      end
      pid = fork_from_mold(index, [status_w, control_w])
      generation = pid ? @generation : 0
      pid ||= Signals.forking_worker { Process.fork { worker_main(index, status_w, control_w, [status_r, control_m, *others]) } }
      status_w.close
      control_w.close
      @workers[index] = handle = WorkerHandle.new(pid: pid, index: index, phase: @phase, status_io: status_r,
                                                  control_io: control_m, now: now, generation: generation)
      exited(handle, @unknown_exits.delete(pid)) if @unknown_exits.key?(pid)
    end

    def worker_main(index, status_w, control_w, close_ios)
      Worker.main(close_ios, @signals, index: index, options: @options, app: @app, binder: @binder,
                                       log_writer: @log_writer, status_io: status_w, control_io: control_w,
                                       load_table: @load_table)
    end

    # Every worker drains (TERM) or halts (INT); #finish_stop waits for them.
    def stop_serving(how)
      @stop_deadline = now + (how == :halt ? STOP_GRACE : @options[:drain_timeout] + STOP_GRACE)
      sig = how == :halt ? "INT" : "TERM"
      (@workers.values + @replacing.values + [*@mold]).each { |h| h.stop_sent_at ||= now }
      # A worker still booting has no request to drain (and may be stuck in a
      # hook): it is killed rather than waited for.
      handles.each { |h| h.signal(h.booted? ? sig : "KILL") }
    end

    def finish_stop
      if handles.empty?
        exec_restart if @restarting
        @done = true
      elsif now > @stop_deadline
        handles.each { |h| h.signal("KILL") }
        @stop_deadline = now + STOP_GRACE
      end
    end

    def update_title
      ProcessTitle.master(@options[:binds], @options[:tag], booted: @workers.values.count(&:booted?), wanted: @wanted)
    end

    # Workers still running at the end (boot failed, an exception) are killed.
    def release
      handles.each { |h| h.signal("KILL") } unless @done
      handles.each do |h|
        Process.wait(h.pid)
      rescue Errno::ECHILD
        nil
      end
      @load_table&.close
    end
  end
end
