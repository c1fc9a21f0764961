# frozen_string_literal: true

require "serval/ticker"
require "serval/threads"

module Serval
  # The advice log line: every `advice_log_interval` seconds (0: never) the
  # process that supervises (the master in cluster mode, which serves no
  # requests; the one process in single mode) reads the launcher's
  # measurement window, computes the advice (Serval::Advice) and logs
  #
  #   advice: 3 threads (2-4) x 2 processes (cpu share 0.41 from 12,400 requests; running 5 threads, stall p95 38 ms)
  #
  # (the range: Recommender#threads_range; a later line that changes the
  # answer ends with what it was and why: "; was 3 threads (2-4) x 2
  # processes: cpu share 0.41 -> 0.52").
  # when advice first becomes available and whenever the decision (threads
  # or processes) changes. The check simulates fewer requests than
  # `servalctl advise` (CHECK_SETTINGS): about 0.4 s of CPU, spent in a
  # child process at nice 19 (Auto::ModelProcess), not in this one, where it
  # held the GVL from the request threads in single mode: in an open-loop
  # benchmark at half load, the check once a minute took p99 from 150 ms to
  # 600 ms (bench/NOTES.md "The log line"). The child starts at the first
  # check whose window has requests (an idle server starts none).
  #
  # With threads :auto the thread count is auto's decision, not the
  # advice's: the line then gives auto's current count and its model's
  # figures, read from auto's own stats (one decision, one source), and the
  # advice's processes; it is logged when the processes change.
  #
  #   advice: 2 processes; threads :auto runs 3 threads (its model: knee 3, part-load target 4, held 3-4; cpu share 0.41 from 12,400 requests)
  #
  # No thread of its own in single mode: the supervising loop (Supervisor#every
  # and #watch) runs each check in two steps that never wait. The tick reads
  # the window and hands it to the child (ModelProcess#submit: a file and a
  # few bytes on its pipe, a few ms), then watches the child's answer; when
  # it is readable the loop logs the line. Commands (a stop) are served
  # meanwhile, however long the child takes; an answer later than the
  # child's timeout (ModelProcess::TIMEOUT) is given up at the next tick
  # (the child is stopped, the failure logged once, and that tick starts a
  # new check); a check still running when the next is due, and not late,
  # makes that one skipped. A child that fails is logged, not replaced by
  # the check in this process (it would hold the loop for the model's
  # time); the next check starts a new child.
  #
  # The cluster master's check has one step more, which does not wait
  # either: the tick asks every worker for its window (Cluster#window_later),
  # the loop reads the answers as they come, and once every worker answered
  # or failed, or CommandChannel::GRACE passed (a worker that does not
  # answer is left out), it merges them and hands the window to the child.
  # A check whose workers are still answering makes the next one skipped;
  # a stop ends it (#stop). A launcher without the loop gets a Ticker
  # thread ("serval-advice"), as does a runner that cannot take a request
  # without waiting (a check on a thread of its own).
  class AdviceLog
    CHECK_SETTINGS = { sim_requests: 5000, load_requests: 5000 }.freeze
    BOOT_WAIT = 86_400
    THREAD = "serval-advice"
    PRIORITY = -3 # shorter time slices while it holds the GVL beside request threads
    STOP_WAIT = 5 # seconds

    def self.wanted?(launcher)
      launcher.options.fetch(:advice_log_interval, 0).to_f.positive? && launcher.respond_to?(:window)
    end

    def self.after_boot(launcher)
      new(launcher, interval: launcher.options[:advice_log_interval], log_writer: launcher.log_writer).start
    end

    attr_reader :last

    # runner: where the model runs (see Advice::Local.recommend); #start
    # gives it a child process unless one was given.
    def initialize(launcher, interval:, log_writer:, settings: CHECK_SETTINGS, runner: nil)
      @runner = runner
      @launcher = launcher
      @interval = Float(interval)
      @log_writer = log_writer
      @settings = settings
      @last = nil # [threads, processes] last logged
      @last_error = nil
      @request = nil # the check in the child (single mode's loop)
      @watch = nil
    end

    # One check, waiting for it: logs and returns the line when the
    # decision is new, else nil.
    def check
      window = @launcher.window or return nil
      require "serval/advice/local"
      # only the decision is logged: no latency figures, no precision runs
      advice = Advice::Local.recommend(window, stats: @launcher.stats, runner: @runner, load_points: [], precision: false,
                                               **@settings)
      report(advice)
    rescue StandardError => e
      failed(e)
    end

    # From the supervising loop, each interval: the previous check given up
    # if it is late, then a new one handed to the child, unless one runs.
    # Returns the Request, or nil.
    def tick(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      thread = Thread.current
      priority = thread.priority
      thread.priority = PRIORITY # as the thread that ran the check did: shorter slices beside request threads
      submit_check(now)
    ensure
      thread.priority = priority
    end

    private def submit_check(now)
      if @request
        return nil if now < @request.deadline

        collect(now) # late: the answer if it is whole by now, else ModelProcessTimeout (logged)
        return nil if @request
      end
      return nil if @asking && !@asking.ended? # the workers' answers are still coming (a cluster's)
      return submit(@launcher.window) unless cluster?

      # the merged window arrives on the loop (or at once: nobody to ask); nil: the control app is asking
      @asking = @launcher.window_later { |window| submit(window) }
      @request
    rescue StandardError => e
      failed(e)
    end

    # The window handed to the child: the Request, or nil.
    private def submit(window)
      return nil unless window && window[:requests].to_i.positive? # nothing to advise on: no child

      # the machine's facts and the serving processes' memory: read in the child
      pids = Array(window[:per_process]).filter_map { |p| p[:pid] }
      request = @runner.submit(:local_advice, window, pids: pids.empty? ? [Process.pid] : pids, load_points: [],
                                                      precision: false, **@settings)
      return nil unless request # busy with another call

      @request = request
      @watch = @launcher.watch(request.io) { collect }
      request
    rescue StandardError => e
      failed(e)
    end

    # The child's answer, when the loop saw its pipe readable (or the tick
    # found it late): the line logged once it is whole.
    def collect(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      request = @request or return nil
      answer = request.poll(now)
      return nil if answer.equal?(Auto::ModelProcess::Request::PENDING)

      end_check
      report(answer)
    rescue StandardError => e
      end_check
      failed(e)
    end

    def end_check
      @watch&.stop
      @watch = nil
      @request = nil
    end

    # The line for one advice (logged), or nil when the decision is the same.
    def report(advice)
      gc_warning(advice)
      return nil unless advice[:enough_data]

      autos = auto_stats(@launcher.stats)
      decision = autos ? [:auto, advice[:processes]] : advice.values_at(:threads, :processes)
      return nil if decision == @last

      line = autos ? auto_line(advice, autos) : advice[:summary] + changed(advice)
      @last = decision
      @last_advice = advice
      @log_writer.info(line)
      line
    end
    # The advice's warning of a small heap's back-to-back major GCs, logged
    # when it appears and not again until it has gone: no thread count
    # shortens that tail, so it is worth a line of its own.
    def gc_warning(advice)
      text = advice[:gc_warning]
      @log_writer.warn("advice: #{text}") if text && !@gc_warned
      @gc_warned = !text.nil?
    end
    private :end_check, :report, :gc_warning

    def start
      require "serval/auto/model_process"
      @runner ||= Auto::ModelProcess.new
      if @launcher.respond_to?(:every) && on_loop?
        @job = @launcher.every(@interval) { tick }
      elsif @launcher.respond_to?(:every)
        @job = @launcher.every(@interval) { check_on_thread }
      else
        @ticker = Ticker.new(THREAD, @interval, @log_writer, priority: PRIORITY,
                             ready: -> { @launcher.wait_until_booted(BOOT_WAIT) }).start { check }
      end
      self
    end

    # The runner's child is stopped first, so a check in progress ends at
    # once. From the loop's thread, or once the loop has ended (Launcher#run
    # does): the child's pipe, which the loop watches, is closed here.
    def stop
      @job&.stop
      @asking&.cancel
      @watch&.stop
      @ticker&.stop
      @runner&.stop if @runner.respond_to?(:stop)
      @request = nil
      @thread&.join(STOP_WAIT)
    end

    private

    # The check on the loop itself: where the launcher can watch IOs, its
    # window is this process's (single mode) or can be asked without
    # waiting (a cluster's: #window_later), and the runner can take a
    # request without waiting.
    def on_loop?
      @launcher.respond_to?(:watch) && @runner.respond_to?(:submit) && (!cluster? || @launcher.respond_to?(:window_later))
    end

    def cluster?
      @launcher.respond_to?(:options) && @launcher.options.fetch(:workers, 0).to_i.positive?
    end

    def failed(error)
      message = "serval: advice failed (#{error.class}: #{error.message})"
      @log_writer.error(message) unless message == @last_error # once per distinct failure
      @last_error = message
      nil
    end

    # threads :auto's stats: the one process's, or each worker's (cluster);
    # nil when auto is off (its stats are there only when it is on).
    def auto_stats(stats)
      list = stats[:auto] ? [stats[:auto]] : Array(stats[:worker_status]).filter_map { |w| (w[:last_status] || {})[:auto] }
      list.empty? ? nil : list
    end

    def auto_line(advice, autos)
      running = autos.map { |a| a[:target_threads] }.uniq.join("/")
      knees = autos.map { |a| a[:model_threads] }.compact.uniq
      open = autos.map { |a| a[:model_open_threads] }.compact.uniq
      held = autos.map { |a| a[:model_open_range] }.compact.uniq.map { |lo, hi| lo == hi ? lo.to_s : "#{lo}-#{hi}" }
      model = [("knee #{knees.join('/')}" if knees.any?),
               ("part-load target #{open.join('/')}#{", held #{held.join('/')}" if held.any?}" if open.any?)].compact
      format("advice: %d process%s; threads :auto runs %s threads (%scpu share %.2f from %s requests)",
             advice[:processes], advice[:processes] == 1 ? "" : "es", running,
             model.any? ? "its model: #{model.join(', ')}; " : "", advice[:cpu_share].to_f,
             advice[:requests].to_s.reverse.scan(/\d{1,3}/).join(",").reverse)
    end

    # Why the answer moved, when it did: "; was 3 threads (2-4) x 2
    # processes: cpu share 0.41 -> 0.52" (or the processes' reason).
    def changed(advice)
      was = @last_advice or return ""
      require "serval/advice/threads_text"
      why = if was[:cpu_share] && (was[:cpu_share] - advice[:cpu_share]).abs >= 0.005
              format("cpu share %.2f -> %.2f", was[:cpu_share], advice[:cpu_share])
            elsif was[:processes] != advice[:processes]
              "the machine's CPUs or memory changed"
            else
              "the same cpu share: the requests' distribution changed"
            end
      format("; was %s x %d processes: %s", Advice.threads_text(was), was[:processes], why)
    end

    # From the supervising loop: the check on a thread of its own, unless
    # the previous one still runs.
    def check_on_thread
      return if @thread&.alive?

      @thread = Threads.spawn(THREAD, @log_writer) do
        Thread.current.priority = PRIORITY
        check
      end
    end
  end
end
