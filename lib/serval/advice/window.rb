# frozen_string_literal: true

require "serval/keys"

require "serval/advice/distribution"
require "serval/advice/workload"

module Serval
  module Advice
    # A recorded window of one process's requests: what the recommender
    # decides from. A plain Hash (Symbol or String keys, so a JSON file
    # works), seconds everywhere:
    #
    #   {
    #     requests:    12_400,      # requests completed in the window (all, not only sampled)
    #     seconds:     60.0,        # optional: the window's length
    #     max_threads: 5,           # the running thread count
    #     gvl_split:   true,        # Ruby >= 3.2: run / idle / stall measured by the GVL hook (or 1 / 0)
    #     ruby:        "3.3.8",     # optional, for messages
    #     io_waits:    1,           # optional: idle periods per request, a mean (default 1)
    #     gvl_handoff: 2.0e-05,     # optional: seconds the GVL stays free per grant to a waiting thread
    #     processes:   1,           # optional: processes merged into this window (cluster)
    #     cpu_speed:   [1.0, 0.97, 0.62, ...], # optional: the CPU's speed step by step (0.25 s), CPU time /
    #                               # GVL time held, as ext/serval/steadiness.c measures it (Simulation)
    #     outside_cpu: 0.05,        # optional: the process's CPU beyond the GVL, per second held (tail_cpu)
    #     gvl_between: 0.03,        # optional: GVL held outside requests per second held in them (between_cpu)
    #     cpu_per_request: 0.0012,  # optional: the whole process's CPU per request over the window (cpu_scale)
    #     cpu_fit: {fixed: 0.08, per_request: 0.0011, se: 0.00002, steps: 240, busy_p90: 0.5}, # optional: the process's CPU
    #                               # per 0.25 s step regressed on the requests of the step (load_scale)
    #     idle_cpu_wait: 0.3,       # optional: share of the requests' idle time spent ready, waiting for a CPU
    #     idle_send_wait: 0.1,      # optional: GVL waits after preempted sends, the remote's, per second of idle
    #     idle_send_hidden: 0.05,   # optional: the remote's time hidden in GVL waits (HiddenRemote) less the
    #                               # waits the link filed past the answer, per second of idle (may be < 0)
    #     route_samples: [{route:, run:, idle:, stall:, wall:}], # optional: sampled requests with their
    #                               # route (Timing::Routes), for the per-route view (Advice::Routes)
    #     loaded:      {requests: 9_000, seconds: 30.0}, # optional: the busy part of the window (its 10 s
    #                               # steps at half the busiest one's rate or more; Timing::Window#loaded)
    #     db_pools:    [{name: "primary", size: 5, ...}],  # optional, as in Server#stats
    #
    #     # Per-request figures, either paired records (preferred: keeps a
    #     # request's run and idle together) ...
    #     samples: [{run:, idle:, stall:, pool_wait:, lock:, queue:, wall:, shape:}, ...],
    #     # (lock, optional: waits for a Ruby lock, Ruby 3.3+; not in idle)
    #     # (shape, optional: [held, idle, ..., held] seconds in order, Workload)
    #     # ... or histograms, one per figure ({bounds:, counts:, sum:}, see
    #     # Distribution): run, idle, stall, pool_wait, lock, queue, wall.
    #     histograms: { run: {...}, idle: {...}, pool_wait: {...} },
    #   }
    #
    # Ruby 3.1 (gvl_split: false) has no GVL hook: samples carry `cpu` and
    # `wall` of the sampled requests (run = cpu, idle = wall - cpu, which also
    # holds GVL stall); histograms `run` and `idle` hold those same figures
    # (the server files them so), or `cpu` and `wait`.
    #
    # The model's I/O is idle minus pool_wait: waiting for a database
    # connection is idle to the GVL but is the pool's doing, which the model
    # adds back for a given pool size. And less idle_cpu_wait's share: a thread
    # whose answer has come but that waits for a CPU (busy with the GVL's
    # holder) before it can ask for the GVL is, to the model, a thread
    # waiting for the GVL - it plays that wait as stall, so leaving it in
    # the I/O would count it twice. Plus idle_send_wait's share: the GVL
    # waits after sends that the wait for a CPU made too long for the GVL
    # hook's link (ext/serval/gvl.c), filed as stall though the remote was
    # working all the while. And idle_send_hidden's: the remote's time in
    # GVL waits during which the answer came (HiddenRemote).
    #
    # Lock waits (`lock`) are not in idle, so not in the I/O either: the
    # recommender models them as a lock the threads share (Advice::Lock).
    #
    # The samples (a few thousand at most) keep each request's figures
    # together; the histograms' sums cover every request of the window. The
    # model takes the samples' shapes at the histograms' means: each figure
    # of the samples is scaled so that its mean is the histogram's
    # (#calibrated) - a thousand exponential samples put the mean a few per
    # cent off either way, and the model's top and its low counts move with it.
    class Window
      FIGURES = %i[run idle stall pool_wait lock queue wall cpu wait].freeze

      attr_reader :route_samples
      attr_reader :requests, :max_threads, :seconds, :ruby, :io_waits, :pools, :samples, :histograms, :processes,
                  :handoff, :timeslice, :cpu_speed, :outside_cpu, :gvl_between, :idle_cpu_wait,
                  :idle_send_wait, :idle_send_hidden, :cpu_per_request, :cpu_fit, :gc

      def initialize(hash)
        h = symbolize(hash)
        raise ArgumentError, "a window is a Hash" unless h.is_a?(Hash)

        @requests = Integer(h[:requests] || samples_of(h).size)
        @max_threads = h[:max_threads] && Integer(h[:max_threads])
        @seconds = h[:seconds] && Float(h[:seconds])
        @gvl_split = ![false, nil, 0, "0", "false"].include?(h.fetch(:gvl_split, true)) # stats say 0 / 1
        @ruby = h[:ruby]&.to_s
        @io_waits = Float(h[:io_waits] || 1) # a mean: 1.9 stays 1.9
        @processes = [Integer(h[:processes] || 1), 1].max # a cluster's merged window
        @handoff = Float(h[:gvl_handoff] || 0.0) # seconds the GVL idles per contended grant
        raise ArgumentError, "gvl_handoff must be in [0, 0.1) seconds" unless @handoff >= 0 && @handoff < 0.1

        @timeslice = h[:timeslice] && Float(h[:timeslice]) # fair_timeslice the server ran with; nil: Ruby's
        raise ArgumentError, "timeslice must be in (0, 1] seconds" if @timeslice && !(@timeslice > 0 && @timeslice <= 1)
        @cpu_speed = speeds_of(h[:cpu_speed])
        @outside_cpu = h[:outside_cpu] && Float(h[:outside_cpu]) # process CPU beyond the GVL, per second held
        raise ArgumentError, "outside_cpu must be in [0, 10]" if @outside_cpu && !(@outside_cpu >= 0 && @outside_cpu <= 10)
        @gvl_between = h[:gvl_between] && Float(h[:gvl_between]) # GVL outside requests, per second inside
        # no upper bound: on a tiny request (hello world) Serval's own work
        # between requests holds the GVL many times longer than the request
        raise ArgumentError, "gvl_between must be >= 0 and finite" if @gvl_between && !(@gvl_between >= 0 && @gvl_between.finite?)
        @cpu_per_request = h[:cpu_per_request] && Float(h[:cpu_per_request]) # process CPU per request, seconds
        # no upper bound: over a window of a few requests the process's CPU (boot, GC) can exceed seconds a request
        raise ArgumentError, "cpu_per_request must be >= 0 and finite" if @cpu_per_request && !(@cpu_per_request >= 0 && @cpu_per_request.finite?)
        @cpu_per_request = nil if @cpu_per_request&.zero? # the sampler's ticks (10 ms) saw none: unknown, not free
        @cpu_fit = fit_of(h[:cpu_fit])
        @idle_cpu_wait = h[:idle_cpu_wait] && Float(h[:idle_cpu_wait]) # share of idle spent ready, waiting for a CPU
        raise ArgumentError, "idle_cpu_wait must be in [0, 1)" if @idle_cpu_wait && !(@idle_cpu_wait >= 0 && @idle_cpu_wait < 1)
        @idle_send_wait = h[:idle_send_wait] && Float(h[:idle_send_wait]) # remote's time filed as stall, per idle
        raise ArgumentError, "idle_send_wait must be in [0, 10]" if @idle_send_wait && !(@idle_send_wait >= 0 && @idle_send_wait <= 10)
        @idle_send_hidden = h[:idle_send_hidden] && Float(h[:idle_send_hidden]) # remote's time hidden in GVL waits
        raise ArgumentError, "idle_send_hidden must be in [-1, 10]" if @idle_send_hidden && !(@idle_send_hidden >= -1 && @idle_send_hidden <= 10)
        @loaded = loaded_of(h[:loaded])
        @gc = gc_of(h[:gc])
        @route_samples = Array(h[:route_samples]).select { |r| r.is_a?(Hash) && r[:route] && r[:run] && r[:idle] }
        @pools = Array(h[:db_pools]).map do |p| # other_threads: DbPools.other_takers' threads
          { name: p[:name].to_s, size: Integer(p[:size]), other_threads: Integer(p[:other_threads] || 0).clamp(0, 100_000) }
        end
        @samples = samples_of(h)
        @histograms = (h[:histograms] || {}).slice(*FIGURES).compact
        raise ArgumentError, "requests must be >= 0" if @requests.negative?
      end

      def gvl_split? = @gvl_split

      # The fewest busy steps (0.25 s each: 30 s) whose speeds the open-loop
      # model replays. This VM pauses now and then for a fraction of a
      # second: over a minute that is a step or two in 240, but a 10 s window
      # that happens to hold one pause reads it as a tenth of the time at
      # 60 % speed and the replay lengthens p99 by a fifth or more (the
      # bench's 20 % and 10 % CPU windows, bench/NOTES.md "Session 35").
      # Fewer steps: no replay (the speeds still make cpu_steadiness).
      SPEED_REPLAY_MIN_STEPS = 120

      # cpu_speed when it has SPEED_REPLAY_MIN_STEPS steps or more, else nil.
      def replayed_speed = @cpu_speed && @cpu_speed.size >= SPEED_REPLAY_MIN_STEPS ? @cpu_speed : nil

      # Major GCs a second over the window's gc figures (Timing::GcRecord);
      # nil without them.
      def major_gc_rate = @gc && @gc[:majors] / @gc[:seconds]

      # Requests a second one process served over the window (a cluster's
      # window sums its workers); nil without the window's length.
      def rate_per_process
        @seconds&.positive? ? @requests / @seconds / @processes : nil
      end

      # The rate while the server was busy (the window's `loaded`: its 10 s
      # steps at half the busiest one's rate or more), per process; else
      # rate_per_process.
      def loaded_rate_per_process
        l = @loaded
        return rate_per_process unless l && l[:seconds].to_f.positive?

        l[:requests].to_f / Float(l[:seconds]) / @processes
      end

      # How many measured requests the figures rest on.
      def measured
        return @samples.size if @samples.any?

        h = @histograms[:run] || @histograms[:cpu]
        h ? Distribution.from(h).count : 0
      end

      # The smallest database pool: the one that binds first.
      def pool
        @pools.min_by { |p| p[:size] }
      end

      def workload(split: :equal)
        w = unscaled_workload(split: split)
        k = cpu_scale(w) * load_scale(w)
        w = w.scale_run(k) if k < 1.0
        tail = tail_cpu(w)
        between = between_cpu(w)
        tail.positive? || between.positive? ? w.with_tail(tail, between: between) : w
      end

      # The factor (<= 1) the requests' run is taken at so that the GVL time
      # the model charges a request - its run, the GVL held between requests
      # (gvl_between) and the process's CPU beyond the GVL (outside_cpu) -
      # is no more than the whole process's CPU per request measured over
      # the same window (cpu_per_request). outside_cpu is the process's CPU
      # less the GVL held, so the charge is the process's CPU per request
      # whenever the GVL's holders were on a CPU while they held it; it
      # exceeds that CPU by the time a holder kept the GVL off a CPU -
      # another process (or a shared, throttled CPU) running while the
      # holder waited for it to come back. That time is the machine's at
      # the time of the window, not the requests' work. The three terms all
      # scale with run, so one factor brings the charge down to the
      # measured CPU. 1.0 without the figures (Ruby < 3.2, a window of an
      # older server) or when the charge is within the measured CPU.
      # (A holder that blocks in C without giving the GVL up - a driver
      # that does its I/O holding it - also keeps the GVL off a CPU, and
      # there the GVL really is busy: this takes that time out too.)
      def cpu_scale(workload = nil)
        return 1.0 unless @gvl_split && @cpu_per_request && @outside_cpu

        run = (workload || unscaled_workload).mean_run
        charged = run * (1.0 + @gvl_between.to_f + @outside_cpu)
        return 1.0 unless charged > @cpu_per_request

        @cpu_per_request / charged
      end

      # The fit's standard error must be at most this share of per_request,
      # and the fixed CPU at least LOAD_FIXED_MIN of a CPU, for load_scale.
      LOAD_FIT_ERROR = 0.1
      LOAD_FIXED_MIN = 0.01
      LOAD_SCALE_MIN = 0.5 # the factor is at least this: a fit that says more is not believed
      LOAD_FIT_MAX_BUSY = 0.8 # the fit's steps' busy_p90 at most this: a process with headroom

      # The CPU a request costs once the process is saturated, from the
      # window's per-step fit (cpu_fit: cpu = fixed x seconds + per_request
      # x requests): per_request / (1 - fixed), the requests sharing what
      # the fixed part leaves of the CPU. nil without a usable fit: Ruby <
      # 3.2, an older server, a window whose steps all saw the same rate,
      # a standard error above LOAD_FIT_ERROR of per_request, a fixed part
      # below LOAD_FIXED_MIN (then cpu_per_request already is this cost)
      # or at 90 % of a CPU or more, or steps near saturation (busy_p90
      # above LOAD_FIT_MAX_BUSY, or not measured): a saturated process
      # serves in a step what its CPU allows, so the step's requests follow
      # their cost and the fit reads a CPU fixed at the busy share with a
      # cost per request far too low - the regression needs the requests
      # to come as they arrive.
      def saturated_cpu_per_request
        f = @cpu_fit
        return nil unless @gvl_split && f && @cpu_per_request

        b = f[:per_request]
        a = f[:fixed]
        return nil unless b.positive? && f[:se] <= LOAD_FIT_ERROR * b && a >= LOAD_FIXED_MIN && a < 0.9
        return nil unless f[:busy_p90] && f[:busy_p90] <= LOAD_FIT_MAX_BUSY

        b / (1.0 - a)
      end

      # The factor (<= 1) the requests' run is taken at, beyond cpu_scale,
      # so that the model charges a request what it costs at saturation
      # (saturated_cpu_per_request) rather than at the window's rate: a
      # window recorded at part load spreads the process's fixed CPU
      # (timers, idle wake-ups, a logger's flush) over fewer requests, and
      # cpu_per_request, the cap cpu_scale applies, is that much above the
      # cost a request has when the process is busy. 1.0 without a usable
      # fit or when the charge (after cpu_scale) is within it.
      def load_scale(workload = nil)
        sat = saturated_cpu_per_request or return 1.0
        w = workload || unscaled_workload
        charged = w.mean_run * (1.0 + @gvl_between.to_f + @outside_cpu.to_f) * cpu_scale(w)
        return 1.0 unless charged > sat

        (sat / charged).clamp(LOAD_SCALE_MIN, 1.0)
      end

      # The requests as measured: no cpu_scale, no tail, no between.
      def unscaled_workload(split: :equal)
        if @samples.any?
          Workload.new(pairs: calibrated.map { |s| pair(s) }, io_waits: @io_waits, split: split)
        else
          run = dist(:run) || dist(:cpu)
          idle = dist(:idle) || dist(:wait)
          raise ArgumentError, "the window has neither samples nor run and idle histograms" unless run && idle

          Workload.new(run: run, io: scaled_io(idle), io_waits: @io_waits, split: split)
        end
      end

      # Seconds per request the GVL's holder loses, once the GVL is busy, to
      # the rest of its process on one CPU: the CPU the process used beyond
      # the GVL (outside_cpu per second held, times the mean run) less what
      # the model already charges as handoffs (one per CPU segment at
      # saturation). The advice sizes one process per CPU, so the event
      # loop and the system calls share the GVL holder's CPU.
      #
      # The Simulation runs it while the GVL is free and takes from the
      # holders only what finds the GVL busy (its loop_cpu).
      def tail_cpu(workload)
        return 0.0 unless @outside_cpu

        [(@outside_cpu * workload.mean_run) - (@handoff * workload.mean_segments), 0.0].max
      end

      # Seconds per request a thread holds the GVL outside the request's
      # measured span (gvl_between x mean run): played after the response
      # is out (Simulation's `between`), where it delays the thread's next
      # request, not this one's answer.
      def between_cpu(workload)
        @gvl_between ? @gvl_between * workload.mean_run : 0.0
      end

      # Mean of one measured figure (nil when it was not recorded).
      def mean(figure)
        if @samples.any?
          vals = @samples.filter_map { |s| value(s, figure) }
          return vals.empty? ? nil : vals.sum / vals.size
        end
        dist(figure)&.mean
      end

      # Share of the sampled requests whose figure is above zero (how many
      # waited for a lock at all); nil without samples.
      def positive_share(figure)
        vals = @samples.filter_map { |s| value(s, figure) }
        vals.empty? ? nil : vals.count(&:positive?).fdiv(vals.size)
      end

      def quantile(figure, q)
        if @samples.any?
          vals = @samples.filter_map { |s| value(s, figure) }.sort
          return Advice.quantile(vals, q)
        end
        dist(figure)&.quantile(q)
      end

      # Figures the samples are scaled by, to the histograms' means.
      CALIBRATED = %i[run idle pool_wait lock cpu wall].freeze
      # A histogram whose mean is this far from the samples' is not of the
      # same requests (a hand-made window): the samples are kept as they are.
      CALIBRATION_RANGE = (0.5..2.0)

      # The samples with each figure in CALIBRATED scaled so that its mean is
      # its histogram's (sum / count: every request of the window), where
      # both are there (class comment). Ruby 3.1's server files cpu in `run`.
      def calibrated
        factors = CALIBRATED.filter_map { |figure| (k = calibration(figure)) && [figure, k[0]] }.to_h
        return @samples if factors.empty?

        @samples.map do |s|
          s.merge(factors.filter_map { |f, k| [f, Float(s[f]) * k] if s[f] }.to_h)
        end
      end

      # How many requests the model's mean of `figure` rests on: its
      # histogram's count when the samples are taken at its mean, else the
      # samples'.
      def mean_basis(figure)
        k = calibration(figure)
        k ? k[1] : @samples.count { |s| s[figure] }
      end

      private

      # [factor, histogram count] for one figure, or nil (#calibrated).
      def calibration(figure)
        h = @histograms[figure] || (figure == :cpu && !@gvl_split && @histograms[:run]) or return nil
        n = Array(h[:counts]).sum
        vals = @samples.filter_map { |s| s[figure] && Float(s[figure]) }
        return nil unless n.positive? && h[:sum] && vals.any?

        ours = vals.sum / vals.size
        return nil unless ours.positive?

        k = Float(h[:sum]) / n / ours
        CALIBRATION_RANGE.cover?(k) ? [k, n] : nil
      end

      def fit_of(f)
        return nil if f.nil?
        raise ArgumentError, "cpu_fit is {fixed:, per_request:, se:, steps:}" unless f.is_a?(Hash) && f[:fixed] && f[:per_request]

        out = { fixed: Float(f[:fixed]), per_request: Float(f[:per_request]), se: Float(f[:se] || Float::INFINITY),
                steps: Integer(f[:steps] || 0), inflight: f[:inflight] && Float(f[:inflight]),
                busy_p90: f[:busy_p90] && Float(f[:busy_p90]) }
        unless out[:fixed].finite? && out[:per_request].finite? && !out[:se].nan? && out[:se] >= 0
          raise ArgumentError, "cpu_fit's figures must be finite (se >= 0)"
        end

        out
      end

      def loaded_of(l)
        return nil if l.nil?
        raise ArgumentError, "loaded is {requests:, seconds:}" unless l.is_a?(Hash)

        out = { requests: Integer(l[:requests]), seconds: Float(l[:seconds]) }
        raise ArgumentError, "loaded requests and seconds must be >= 0" if out[:requests].negative? || !(out[:seconds] >= 0)

        out
      end

      # {seconds:, majors:, nofree:, heap: {index:, slot_size:, slots:}, ...}
      # (Timing::GcRecord); nil without it or with no time between its snapshots.
      def gc_of(g)
        return nil if g.nil?
        raise ArgumentError, "gc is {seconds:, majors:, ...}" unless g.is_a?(Hash)

        seconds = Float(g[:seconds])
        return nil unless seconds.positive? && seconds.finite?

        majors = Integer(g[:majors])
        nofree = g[:nofree] && Integer(g[:nofree])
        raise ArgumentError, "gc majors and nofree must be >= 0" if majors.negative? || nofree&.negative?

        heap = g[:heap].is_a?(Hash) ? { index: Integer(g[:heap][:index]), slot_size: Integer(g[:heap][:slot_size]), slots: Integer(g[:heap][:slots]) } : nil
        { seconds: seconds, majors: majors, collections: g[:collections] && Integer(g[:collections]),
          gc_time: g[:gc_time] && Float(g[:gc_time]), nofree: nofree, heap: heap }
      end

      def speeds_of(list)
        return nil if list.nil?
        raise ArgumentError, "cpu_speed is an Array of speeds in (0, 1.5]" unless list.is_a?(Array)

        speeds = list.map { |v| Float(v) }
        raise ArgumentError, "cpu_speed is an Array of speeds in (0, 1.5]" unless speeds.all? { |v| v > 0 && v <= 1.5 }

        speeds.empty? ? nil : speeds
      end

      def samples_of(h)
        Array(h[:samples]).map do |s|
          raise ArgumentError, "a sample is a Hash of seconds" unless s.is_a?(Hash)

          s
        end
      end

      def value(sample, figure)
        v = sample[figure]
        v ||= sample[:wall] && sample[:cpu] && (sample[:wall] - sample[:cpu]) if figure == :wait
        v && Float(v)
      end

      # [run, io] of one request (with its shape when measured): io excludes
      # pool_wait and, with the GVL split, idle_cpu_wait's share (class comment).
      def pair(s)
        pw = s[:pool_wait].to_f
        if @gvl_split && s[:run] && s[:idle]
          pair = [Float(s[:run]), [Float(s[:idle]) - pw, 0.0].max * ready_factor]
          pair << s[:shape] if s[:shape].is_a?(Array) && s[:shape].size.odd?
          pair
        elsif s[:cpu] && s[:wall]
          cpu = Float(s[:cpu])
          [cpu, [Float(s[:wall]) - cpu - pw, 0.0].max]
        elsif s[:run] && s[:idle]
          [Float(s[:run]), [Float(s[:idle]) - pw, 0.0].max]
        else
          raise ArgumentError, "a sample needs run and idle (Ruby 3.2+) or cpu and wall (Ruby 3.1)"
        end
      end

      def dist(figure)
        spec = @histograms[figure]
        spec && Distribution.from(spec)
      end

      # Histograms cannot subtract pool_wait request by request: scale idle
      # so its mean drops by pool_wait's mean (and idle_cpu_wait's share).
      def scaled_io(idle)
        pw = dist(:pool_wait)&.mean.to_f
        factor = @gvl_split ? ready_factor : 1.0
        return idle if (pw.zero? && factor == 1.0) || idle.mean.zero?

        factor *= [idle.mean - pw, 0.0].max / idle.mean
        ScaledDistribution.new(idle, factor)
      end

      # What remains of idle once the wait for a CPU is out and the remote's
      # time filed as stall is in (class comment).
      def ready_factor = [1.0 - @idle_cpu_wait.to_f + @idle_send_wait.to_f + @idle_send_hidden.to_f, 0.01].max

      def symbolize(obj) = Keys.symbolize(obj)
    end
  end
end
