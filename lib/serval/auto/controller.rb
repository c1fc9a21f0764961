# frozen_string_literal: true

module Serval
  module Auto
    # One interval of one process, as the controller sees it (seconds, shares
    # 0..1). Built by Sampler from the server's counters, or by tests.
    #
    #   seconds     the interval's length
    #   requests    requests completed in it
    #   threads     the thread count (max threads) it ran with
    #   queue_p90   90th percentile of the time a request waited for a thread
    #   queue_mean  its mean
    #   stall_mean  mean time a request waited for the GVL (0 on Ruby 3.1: unknown)
    #   stall_p95   95th percentile of the same
    #   lock_mean   mean time a request waited for a Ruby lock (nil before Ruby 3.3:
    #               not told from I/O). Like the GVL a lock serialises the threads,
    #               and more threads wait longer for it (a logger's monitor): the
    #               rules that ask whether requests stall count both (#waiting)
    #   wall_mean   mean time from app call to response handed over
    #   gvl         share of the interval some thread held the GVL (Ruby 3.1: process CPU)
    #   pool        the smallest database pool's size; nil without Active Record
    #   pool_name   its name, for the reason
    Measurement = Struct.new(:seconds, :requests, :threads, :queue_p90, :queue_mean, :stall_mean, :stall_p95,
                             :wall_mean, :gvl, :pool, :pool_name, :lock_mean, keyword_init: true) do
      def rps = seconds.positive? ? requests / seconds : 0.0

      # Mean time a request waited for the GVL or a Ruby lock.
      def waiting = stall_mean.to_f + lock_mean.to_f

      # Mean time from a request's arrival in Serval to its response.
      def latency = (queue_mean || queue_p90).to_f + wall_mean.to_f
    end

    # What the controller decided after one measurement: `target` threads
    # (changed: it differs from the threads the measurement ran with), and
    # why, in one line.
    Decision = Struct.new(:target, :from, :changed, :reason, keyword_init: true)

    # Moves a process's thread count from measurements; a pure object (no
    # clock, no server), fed one Measurement per interval and, now and then,
    # the model's prediction (Auto::Model: closed-loop req/s and stall for
    # 1..N threads from the window's requests).
    #
    # Each interval gives a vote (up, down, hold) with a target:
    #
    # - up when requests queue (queue p90 above `queue_target`) and the model
    #   puts its target above the count (target: the fewest threads reaching
    #   `fraction` of the model's best, plus `margin`; at saturation - the
    #   process serves at least `open_load` of what the model says the count
    #   serves - `saturated_fraction`: there clients wait in the queue for
    #   what the threads do not serve, so their latency is clients / req/s
    #   and a thread that adds 1-3 % req/s shortens it, stall or not; the
    #   model's curve also flattens a little earlier than measured sweeps),
    #   or, without a model, the GVL has headroom (held < `gvl_headroom`) and
    #   the stall is low (mean < `stall_share` of wall): one more;
    #   or, with a model that says hold, the GVL is still free part of the
    #   time (held < `probe_gvl`) while a standing queue waits (mean queue
    #   wait > `probe_queue` x wall: every thread busy, not a burst of
    #   arrivals at part load): one more, to measure
    #   (a probe: the model's knee from a window at one count is often a
    #   thread or two low, bench/NOTES.md "threads :auto (issue 10)"); the measured rule below takes
    #   it back if it added nothing, and then it is a ceiling;
    # - down when stall grew without gain: a thread fewer served as many
    #   req/s (measured, within `down_gain`, at this workload) with less stall
    #   and no longer latency (queue + wall: under open-loop arrivals req/s
    #   is the arrival rate and a thread's gain is a shorter wait; not at
    #   part load with a model that predicts p99, where the rule below
    #   decides: there two 5 s means of latency differ by more than a thread
    #   changes them, and the comparison kept whichever count had the quieter
    #   interval); or the
    #   model puts the count `slack` threads past its target while
    #   requests stall (mean > `stall_share` of wall), unless this process
    #   measured that the count gained over one fewer (more req/s or a
    #   shorter latency, by more than `down_gain`): measurement beats the
    #   model; and with open-loop figures never below the fewest threads
    #   the part-load rule holds at the same arrivals (#open_floor);
    # - at part load (arrivals below `open_load` of what the model says the
    #   count serves), with a model that predicts
    #   open-loop p99 at the measured arrival rate: toward the fewest threads
    #   whose predicted p99 is within `open_gain` of the lowest (the top of
    #   the cliff: below it a count cannot keep up and p99 climbs steeply)
    #   plus `open_margin` (the model's capacity per count errs by a few per
    #   cent), and only while that one is as good within `open_gain`; held
    #   anywhere from that fewest to `open_margin` past it, over the last
    #   `open_memory` models (hysteresis). Not toward the lowest predicted
    #   p99 itself: above the cliff the predicted curve is flat within the
    #   model's noise (3,000 simulated requests: a few per cent), so the
    #   count with the lowest figure wanders over the flat part from one
    #   model run to the next, and a rule that went up to it (or past it)
    #   whenever it lay above ratcheted the count up each time it did
    #   (bench/NOTES.md "Auto's part-load target"), while measured p99
    #   grows a few per cent per thread there (more threads, more GVL
    #   contention). (Up or down; the closed-loop rules above are
    #   about saturation and do not apply: at part load req/s is the
    #   arrival rate whatever the count, and a burst queues at any count);
    # - hold otherwise, with too few requests, or in the `cooldown` intervals
    #   right after a change (the first straddles it).
    #
    # A change needs `agree` consecutive votes the same way, moves at most
    # `step` threads (up to the model's target at once behind a standing
    # queue), stays within [min, max] and never passes the database
    # pool (a pool below the current count is applied at once). A count that
    # was measured to add nothing becomes a ceiling for `memory` intervals
    # and then for as long as the model's target stays what it was, so the
    # model cannot push the count back up into it (no oscillation); measured
    # figures are forgotten after `memory` intervals, so a changed workload
    # is measured afresh.
    class Controller
      DEFAULTS = {
        agree: 2,             # consecutive votes the same way before a change
        cooldown: 1,          # intervals ignored after a change
        step: 2,              # most threads added or removed at once
        min_requests: 30,     # fewer requests in an interval: hold
        queue_target: 0.005,  # queue p90 above this: requests are waiting for a thread
        gvl_headroom: 0.85,   # without a model: GVL held below this share is headroom
        stall_share: 0.25,    # stall mean above this share of wall: requests stall
        down_gain: 0.01,      # down: a measured thread that added less than this share is removed
        fraction: 0.97,       # model target: fewest threads reaching this share of its best ...
        saturated_fraction: 0.995, # ... or this share while the process serves all the count can (saturation)
        margin: 0,            # ... plus this many (0: the model's knee is within one of the measured one
                              # either way since it charges the handoff and replays shapes; the probe
                              # finds a thread more where it pays:
                              # bench/NOTES.md "Concurrency advice (issue 9)")
        slack: 2,             # model-driven down: only this many threads past its target
        memory: 30,           # intervals a measured figure or ceiling is kept
        probe_gvl: 0.97,      # with a model that holds: GVL held below this share while requests queue ...
        probe_queue: 2.0,     # ... longer than this many times their wall (a standing queue) -> probe +1
        open_load: 0.9,       # arrivals below this share of the model's req/s at the count, no standing queue:
                              # part load, where the count with the lowest predicted p99 is the target
        open_gain: 0.05,      # ... the counts whose predicted p99 is within this share of the lowest are alike:
        open_margin: 1,       # ... the target is the fewest of them plus this many, and a count from that fewest
                              # to this many past it is held ...
        open_cliff: 0.25,     # ... where one thread fewer than that fewest is predicted more than this share
                              # above the lowest p99 (a cliff right below: a model a few per cent off in
                              # capacity would put the count on it), or that fewest is 1; on a gentle slope
                              # the fewest itself (35 % CPU: one past it measured no better, often worse)
        open_memory: 2        # ... over this many of the latest models (the fewest wanders by one between runs)
      }.freeze

      # The fewest threads (1-based) whose predicted req/s reaches `fraction`
      # of the best; the last count when none does.
      def self.knee(rps, fraction)
        best = rps.max
        (rps.index { |r| r >= fraction * best } || (rps.size - 1)) + 1
      end

      # From a model's open-loop p99 for 1..top threads: [fewest threads
      # within `gain` of the lowest (the top of the cliff), the part-load
      # target (that plus up to `margin` while as good, where the count below
      # it is more than `cliff` above the lowest or it is 1; nil cliff: always),
      # the lowest's count (the fewest among equals)]; nil when no count keeps up.
      def self.open_target(p99, top, gain, margin, cliff = nil)
        counts = (1..top).select { |t| p99[t - 1] }
        best = counts.min_by { |t| [p99[t - 1], t] }
        return nil unless best && p99[best - 1].finite?

        near = ->(t) { p99[t - 1] && p99[t - 1] <= p99[best - 1] * (1 + gain) }
        lo = counts.find(&near)
        below = lo > 1 ? p99[lo - 2] : nil
        margin = 0 if cliff && below && below.finite? && below <= p99[best - 1] * (1 + cliff)
        [lo, counts.select { |t| t >= lo && t <= lo + margin && near.(t) }.max, best]
      end

      # open_target with this controller's settings.
      def open_target(p99, top)
        Controller.open_target(p99, top, @s[:open_gain], @s[:open_margin], @s[:open_cliff])
      end

      # reason: the latest interval's (a hold says why it held);
      # change_reason: the last change's (nil before the first).
      attr_reader :target, :min, :max, :reason, :change_reason, :settings

      def initialize(min:, max:, initial:, **settings)
        unknown = settings.keys - DEFAULTS.keys
        raise ArgumentError, "unknown controller setting(s): #{unknown.join(', ')}" if unknown.any?
        raise ArgumentError, "min must be >= 1 and <= max" unless min.is_a?(Integer) && min >= 1 && min <= max

        @min = min
        @max = max
        @s = DEFAULTS.merge(settings)
        @settings = @s
        @target = initial.clamp(min, max)
        @reason = "starting at #{@target} threads"
        @change_reason = nil
        @votes = []
        @quiet = 0       # intervals left in cooldown
        @tick = 0
        @seen = {}       # threads => [rps, waiting (stall + lock), tick, latency] measured while requests queued
        @ceiling = nil   # [threads, until tick, the model's target when set]
        @want = nil      # the model's latest target
        @open_model = nil # the latest model seen at part load ...
        @open_los = []   # ... and the fewest threads within open_gain of its lowest p99, latest models last
      end

      # [fewest, most] threads held at part load (from the latest models'
      # fewest within open_gain of the lowest p99, to open_margin past the
      # highest of them; within min..max); nil before a model with p99 at
      # part load.
      def open_band
        return nil if @open_los.empty?

        low, high = @open_los.minmax
        [low.clamp(@min, @max), (high + @s[:open_margin]).clamp(@min, @max)]
      end

      # m: a Measurement; model: nil or {rps: [..], stall: [..], p99: [..] or nil} for 1..N
      # threads (p99: open-loop latency at the arrival rate the model was run at).
      def observe(m, model: nil)
        @tick += 1
        from = m.threads || @target
        cap, cap_reason = upper(m)
        if @target > cap
          return change(from, cap, "#{cap_reason}#{figures(m)}")
        end

        remember(m, model)
        if @quiet.positive?
          @quiet -= 1
          return hold(from, "cooldown after the last change#{figures(m)}")
        end

        dir, want, why = vote(m, model, cap)
        @votes << dir
        @votes.shift while @votes.size > @s[:agree]
        agreed = dir != :hold && @votes.size == @s[:agree] && @votes.uniq == [dir]
        return hold(from, "#{why}#{figures(m)}") unless agreed

        # a standing queue behind a model that wants more threads: all the way
        # at once (each interval at too few threads lengthens the queue every
        # request after it waits through: a Rails process starting at 3 threads
        # took four model runs to reach 11, bench/NOTES.md "The advice on mixed routes")
        jump = dir == :up && model && standing?(m)
        to = dir == :up ? [want, jump ? want : @target + @s[:step]].min : [want, @target - @s[:step]].max
        change(from, to.clamp(@min, cap), "#{why}#{' (a standing queue: at once)' if jump && want - @target > @s[:step]}#{figures(m)}")
      end

      private

      def upper(m)
        return [@max, "max #{@max}"] unless m.pool && m.pool < @max

        pool = [m.pool, @min].max
        [pool, "database pool #{m.pool_name ? "#{m.pool_name} " : ''}has #{m.pool} connections"]
      end

      def vote(m, model, cap)
        n = @target
        if m.requests < @s[:min_requests]
          return [:hold, n, "#{m.requests} requests in the interval, need #{@s[:min_requests]}"]
        end

        queued = m.queue_p90.to_f > @s[:queue_target]
        return model_vote(m, model, cap, queued) if model

        measured_down(m, n) || plain_vote(m, cap, queued)
      end

      # "Down when stall grows without throughput gain", from what this
      # process measured at n - 1 and n threads under the same queueing
      # (stall: the GVL's and, where measured, a Ruby lock's waits).
      def measured_down(m, n)
        below = @seen[n - 1]
        here = @seen[n]
        return nil unless below && here && n > @min
        return nil unless here[0] < below[0] * (1 + @s[:down_gain]) && here[1] > below[1] &&
                          here[3] > below[3] * (1 - @s[:down_gain])

        @ceiling = [n - 1, @tick + @s[:memory], @want]
        [:down, n - 1, format("%d threads served %.1f req/s, %d served %.1f with less %s (%.1f vs %.1f ms)",
                              n, here[0], n - 1, below[0], m.lock_mean ? "waiting for the GVL and locks" : "stall",
                              below[1] * 1e3, here[1] * 1e3)]
      end

      def model_vote(m, model, cap, queued)
        n = @target
        rps = model[:rps].map(&:to_f)
        top = [cap, rps.size].min
        here = at_count(rps, n)
        # arrivals that no count keeps up with by the model's open-loop
        # figures are saturation too, whatever this interval's req/s read:
        # at 87 % of capacity by one and "unbounded" by the other, the 97 %
        # knee took 15 threads to 13, 2.5 % less capacity at 87 % load
        # (bench/NOTES.md "Session 32")
        floor = open_floor(model, cap)
        full = saturated?(m, here) || (model[:p99] && floor.nil?)
        knee = Controller.knee(rps[0, top], full ? @s[:saturated_fraction] : @s[:fraction])
        @want = (knee + @s[:margin]).clamp(@min, top)
        want = [@want, ceiling].min
        open = open_vote(m, model, cap, here)
        return open if open

        down = measured_down(m, n)
        return down if down

        if queued && want > n
          gain = rps[want - 1] / here - 1
          return [:up, want, format("requests queue; the model gives %d threads %.0f req/s (+%d %%, knee %d)",
                                    want, rps[want - 1], (gain * 100).round, knee)]
        end
        down = [want, floor.to_i].max
        if n >= want + @s[:slack] && n > down && stalling?(m) && !measured_gain?(n)
          return [:down, down, format("the model gives %d threads %.0f req/s, as many as %d (%.0f) with less stall%s",
                                      want, rps[want - 1], n, here,
                                      down > want ? format("; to %d: the fewest whose p99 at these arrivals is within " \
                                                           "%d %% of the lowest", down, (@s[:open_gain] * 100).round) : "")]
        end
        if queued && probe?(m, n, cap)
          return [:up, n + 1, format("requests queue while the GVL is free %d %% of the time: one more thread to " \
                                     "measure (the model's target is %d)", ((1 - m.gvl) * 100).round, want)]
        end
        [:hold, n, format("the model puts the knee at %d threads (target %d)", knee, want)]
      end

      # Part load: nil when the model has no open-loop figures, none keeps
      # up, or the arrivals come near what the count serves (then the
      # closed-loop rules decide: in a closed loop req/s is what the count
      # serves); else a vote toward the part-load target (#open_target). A
      # queue at part load is not a reason to add threads by itself: the
      # prediction already counts it.
      def open_vote(m, model, cap, here_rps)
        p99 = model[:p99]
        return nil unless p99 && !saturated?(m, here_rps)

        n = @target
        now = at_count(p99, n)
        return [:hold, n, "part load; the model has no p99 for #{n} threads yet"] unless now

        lo, target, best = open_target(p99, [cap, ceiling, p99.size].min)
        return nil unless lo

        low, high = remember_open(model, lo)
        load = format("arrivals at %.0f req/s, %d %% of what %d threads serve", m.rps, (m.rps / here_rps * 100).round, n)
        within = now <= p99[best - 1] * (1 + @s[:open_gain])
        if within && n.between?(low, high + @s[:open_margin])
          return [:hold, n, format("%s: the model's p99 at %d threads (%s) is within %d %% of the best (%s at %d), " \
                                   "from %d threads on", load, n, ms(now), (@s[:open_gain] * 100).round,
                                   ms(p99[best - 1]), best, lo)]
        end

        [target > n ? :up : :down, target,
         format("%s: the model's p99 is %s at %d threads, %s at %d (best %d: %s; within %d %% from %d threads on)",
                load, ms(p99[target - 1]), target, ms(now), n, best, ms(p99[best - 1]), (@s[:open_gain] * 100).round, lo)]
      end

      # Near saturation the closed-loop rules decide, but not to fewer threads
      # than the part-load rule would hold at the same arrivals (the fewest
      # whose predicted open-loop p99 is within open_gain of the lowest): a
      # count the down rule chose below it made the next interval part load
      # and the part-load rule took it back up (70 % CPU, 5 -> 3 -> 5 in
      # one run, bench/NOTES.md "Auto's part-load target"). nil without
      # open-loop figures.
      def open_floor(model, cap)
        p99 = model[:p99] or return nil
        open_target(p99, [cap, p99.size].min)&.first
      end

      # The fewest-within-gain counts of the latest `open_memory` models
      # (a model is new when the tuner hands over another object): [lowest,
      # highest] of them.
      def remember_open(model, lo)
        if @open_model.equal?(model)
          @open_los[-1] = lo
        else
          @open_model = model
          @open_los << lo
          @open_los.shift while @open_los.size > @s[:open_memory]
        end
        @open_los.minmax
      end

      # The process serves (near) all the model says its count can: a closed
      # loop, or arrivals at or past capacity.
      def saturated?(m, here_rps) = m.rps >= @s[:open_load] * here_rps

      # A model's figure (rps, p99: one per count from 1) at n threads, the
      # last one past the list's end; nil for an empty list.
      def at_count(list, n)
        list[[n, list.size].min - 1] unless list.empty?
      end

      def ms(seconds) = seconds.finite? ? format("%.0f ms", seconds * 1e3) : "unbounded"

      # Every thread busy with requests waiting behind them longer than
      # `probe_queue` x their own time, as in a closed loop; not the bursts of
      # arrivals at part load.
      def standing?(m)
        (m.queue_mean || m.queue_p90).to_f > @s[:probe_queue] * m.wall_mean.to_f
      end

      # A probe needs a standing queue and a GVL free part of the time; and
      # n + 1 not already measured to do no better.
      def probe?(m, n, cap)
        n < [cap, ceiling].min && m.gvl && m.gvl < @s[:probe_gvl] && standing?(m) &&
          !measured_gain?(n + 1, worse: true)
      end

      # Did this process measure n threads doing better than n - 1 (more
      # req/s, or a shorter latency under the same arrivals)? With worse:
      # true, whether n was measured to do no better (so a probe would only
      # repeat it).
      def measured_gain?(n, worse: false)
        below = @seen[n - 1]
        here = @seen[n]
        return false unless below && here

        gain = here[0] > below[0] * (1 + @s[:down_gain]) || here[3] < below[3] * (1 - @s[:down_gain])
        worse ? !gain : gain
      end

      def plain_vote(m, cap, queued)
        n = @target
        return [:hold, n, "no queue"] unless queued
        return [:hold, n, "at the bound (#{cap})"] if n >= [cap, ceiling].min
        return [:hold, n, "GVL busy"] unless m.gvl.to_f < @s[:gvl_headroom]
        return [:hold, n, "requests stall"] if stalling?(m)

        [:up, n + 1, "requests queue while the GVL has headroom"]
      end

      def stalling?(m)
        m.wall_mean.to_f.positive? && m.waiting > @s[:stall_share] * m.wall_mean
      end

      # A count measured to add nothing stays the ceiling for `memory`
      # intervals, and after that for as long as the model's target is the
      # one it was set under (the workload has not changed).
      def ceiling
        return @max unless @ceiling
        return @ceiling[0] if @tick <= @ceiling[1] || (@ceiling[2] && @ceiling[2] == @want)

        @ceiling = nil
        @max
      end

      # Throughput and stall at a thread count, for the comparison of counts
      # (measured_down, measured_gain?): kept only while requests queued
      # (otherwise req/s measures the clients, not the threads) and, where
      # the model has open-loop p99s for the measured arrivals, only when
      # they came near what the model says the count serves (saturated?, as
      # open_vote decides part load): at part load an interval serves what
      # arrives, so a lull at 6 threads (120 req/s) against a burst at 5
      # (150) read "5 served more with less waiting" and took 6 threads to 5
      # (mixed routes at 80 % load, bench/NOTES.md "Session 35"). Without
      # p99s (no arrival rate) every queued interval counts.
      def remember(m, model = nil)
        @seen.delete_if { |_, v| v[2] < @tick - @s[:memory] }
        return unless m.threads && m.requests >= @s[:min_requests] && m.queue_p90.to_f > @s[:queue_target]

        here = model && model[:p99] && at_count(model[:rps], m.threads)
        return if here && !saturated?(m, here.to_f)

        now = [m.rps, m.waiting, @tick, m.latency]
        old = @seen[m.threads]
        now = [(old[0] + now[0]) / 2, (old[1] + now[1]) / 2, @tick, (old[3] + now[3]) / 2] if old
        @seen[m.threads] = now
      end

      def hold(from, why)
        @reason = why
        Decision.new(target: @target, from: from, changed: false, reason: why)
      end

      def change(from, to, why)
        return hold(from, why) if to == @target

        @target = to
        @reason = why
        @change_reason = why
        @votes.clear
        @quiet = @s[:cooldown]
        Decision.new(target: to, from: from, changed: true, reason: why)
      end

      def figures(m)
        parts = [format("queue p90 %.0f ms", m.queue_p90.to_f * 1e3)]
        parts << format("gvl %d %%", (m.gvl * 100).round) if m.gvl
        parts << format("stall p95 %.0f ms", m.stall_p95 * 1e3) if m.stall_p95
        parts << format("lock wait mean %.1f ms", m.lock_mean * 1e3) if m.lock_mean.to_f.positive?
        parts << format("%.0f req/s", m.rps)
        "; #{parts.join(', ')}"
      end
    end
  end
end
