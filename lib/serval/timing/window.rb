# frozen_string_literal: true

require "serval/keys"
require "serval/advice/hidden_remote"
require "serval/timing/gc_record"

module Serval
  class Timing
    # The rolling window of one process, read from the buckets the request
    # path fills in C (ext/serval/window.c: 6 buckets of 10 s, each with
    # histograms and a reservoir of 512 sampled requests), in the shape
    # Serval::Advice::Window takes (see lib/serval/advice/window.rb):
    #
    #   { requests:, seconds:, max_threads:, gvl_split:, ruby:, io_waits:, gvl_handoff:, gvl_handoffs:,
    #     db_pools:, cpu_speed: [0.98, 1.0, 0.61, ...], outside_cpu: 0.07, gvl_between: 0.03, idle_cpu_wait: 0.3,
    #     cpu_per_request: 0.0012,
    #     samples: [{queue:, run:, idle:, stall:, pool_wait:, wall:, lock:, shape:}],
    #     route_samples: [{route:, run:, idle:, stall:, wall:}] (Timing::Routes; only with requests),
    #     loaded: {requests:, seconds:} (#loaded),
    #     gc: {seconds:, collections:, majors:, nofree:, ...} (GcRecord; from the second read on),
    #     sampled_from:, histograms: {queue: {bounds:, counts:, sum:}, ...} }
    #
    # Reading costs the reader, never a request. Samples are drawn at one
    # rate over the whole window (a busy bucket is not outweighed by a quiet
    # one): `sampled_from` is how many requests they were drawn from. On Ruby
    # 3.1 (gvl_split false) only requests that read the CPU clock (one in
    # 1/timing_sample_rate) are sampled: run is their CPU time, idle wall -
    # CPU - pool_wait; queue, wall and pool_wait histograms count every request.
    # On Ruby 3.3+ a sample also has `lock`: its waits for a Ruby lock,
    # which are not in its idle (ext/serval/gvl.c); its shape keeps each as
    # an idle span of 0 (the thread gave the GVL up and asked again).
    # With the GVL hook a sample also carries its `shape`: the request's
    # GVL-held and idle spans in order, [held, idle, held, ..., held]
    # seconds (at most WINDOW_SHAPE_SPANS; later spans fold into the last
    # two), which the model replays instead of splitting run and idle evenly.
    module Window
      FIGURES = %i[queue run idle stall pool_wait wall cpu lock].freeze
      GC_RECORD = GcRecord.new # this process's, fed by every read
      CAP = WINDOW_BUCKETS * WINDOW_RESERVOIR # samples at most, one process or many
      DIGITS = 7 # samples rounded to 0.1 us: a smaller JSON answer
      SPEED_MIN_BUSY = 0.25 # a step's GVL held at least this share of it counts for cpu_speed
      SPEED_MIN_STEPS = 20  # fewer busy steps: no cpu_speed
      SPEED_MIN = 0.05      # a step's speed is at least this (a stopped CPU is not infinitely slow)
      SPEED_CAP = 1_000     # steps a merged window keeps
      OUTSIDE_MIN_STEPS = 4 # busy steps (1 s) needed for outside_cpu
      IDLE_CPU_WAIT_MIN_SPANS = 20 # sampled idle spans needed for idle_cpu_wait

      module_function

      # now: monotonic seconds (tests inject it).
      # timeslice: seconds a request thread keeps the GVL from a waiting one
      # (fair_timeslice), nil for Ruby's own.
      # steadiness: [step, [[at, held, cpu, proc, outside, idle_wait, idle_sampled, spans, send_wait,
      # send_gvl, filed_gvl], ...]] as
      # Native::GVL.steadiness gives it (tests inject it).
      # gc: the GcRecord that gives the window's major GCs (tests inject one).
      def read(now: nil, max_threads: nil, db_pools: nil, gvl_split: Native::GVL.enabled?, rng: Random.new,
               timeslice: nil, steadiness: :native, sends: :native, gc: GC_RECORD)
        seconds, bounds, buckets = Timing.window_buckets(now)
        requests = buckets.sum { |b| b[1] }
        split = buckets.sum { |b| b[2] }
        counts = Array.new(FIGURES.size) { Array.new(bounds.size + 1, 0) }
        sums = Array.new(FIGURES.size, 0.0)
        buckets.each do |b|
          b[4].each_with_index { |c, i| counts[i / (bounds.size + 1)][i % (bounds.size + 1)] += c }
          b[5].each_with_index { |s, k| sums[k] += s }
        end
        # a sample is picked as an Integer (bucket, row) and only the picked
        # become Hashes: reading allocates a few objects per sample, not a
        # dozen (2,700 samples: 55k objects to read before, 10k now; the
        # serving process's heap pays for them, bench/NOTES.md "Session 33")
        refs = buckets.each_with_index.map { |b, i| Array.new(b[6].size / FIGURES.size) { |r| (i << ROW_BITS) | r } }
        picked, sampled_from = uniform(refs, buckets.map { |b| b[7] }, CAP, rng)
        keys = gvl_split ? SPLIT_KEYS : PLAIN_KEYS
        samples = picked.map { |ref| sample(buckets[ref >> ROW_BITS], ref & ROW_MASK, keys, gvl_split) }
        window = { requests: requests, seconds: seconds.round(3), max_threads: max_threads, gvl_split: gvl_split,
                   ruby: RUBY_VERSION, samples: samples, sampled_from: sampled_from,
                   histograms: histograms(bounds, counts, sums) }
        window[:io_waits] = (buckets.sum { |b| b[3] }.to_f / split).round(3) if split.positive?
        at = now || Process.clock_gettime(Process::CLOCK_MONOTONIC)
        loaded = loaded(buckets, seconds, at)
        window[:loaded] = loaded if loaded
        routed = route_samples(at, rng)
        window[:route_samples] = routed if routed.any?
        handoff(window) if gvl_split
        native = steadiness == :native
        steadiness = native_steadiness if native
        from = (now || Process.clock_gettime(Process::CLOCK_MONOTONIC)) - seconds
        speeds = gvl_split && steadiness && cpu_speed(steadiness, from)
        window[:cpu_speed] = speeds if speeds
        outside = gvl_split && steadiness && outside_cpu(steadiness, from)
        window[:outside_cpu] = outside if outside
        between = gvl_split && steadiness && gvl_between(steadiness, from)
        window[:gvl_between] = between if between
        per_request = gvl_split && steadiness && cpu_per_request(steadiness, from, seconds, requests)
        window[:cpu_per_request] = per_request if per_request
        fit = gvl_split && steadiness && cpu_fit(steadiness, from)
        window[:cpu_fit] = fit if fit
        sends = native ? native_sends(from) : nil if sends == :native # injected steps: their sends too
        waited = gvl_split && steadiness && idle_shares(steadiness, from, sends)
        window.merge!(waited) if waited
        window[:db_pools] = db_pools if db_pools
        window[:timeslice] = timeslice if timeslice
        collected = gc&.read(seconds, now: at)
        window[:gc] = collected if collected
        window
      end

      # Windows of several processes (as #read returns them, or parsed from
      # JSON) as one: requests and histograms added, samples drawn at one rate
      # from all, io_waits weighted by requests.
      def merge(windows, rng: Random.new)
        windows = windows.map { |w| symbolize(w) }
        return { requests: 0, samples: [], sampled_from: 0, histograms: {} } if windows.empty?

        first = windows.first
        samples, from = uniform(windows.map { |w| w[:samples] || [] },
                                windows.map { |w| w[:sampled_from] || (w[:samples] || []).size }, CAP, rng)
        requests = windows.sum { |w| w[:requests].to_i }
        merged = { requests: requests, seconds: windows.filter_map { |w| w[:seconds] }.max,
                   max_threads: windows.filter_map { |w| w[:max_threads] }.max,
                   gvl_split: windows.all? { |w| w[:gvl_split] }, ruby: first[:ruby],
                   samples: samples, sampled_from: from, histograms: add_histograms(windows) }
        routed, = uniform(windows.map { |w| w[:route_samples] || [] },
                          windows.map { |w| (w[:route_samples] || []).size }, CAP, rng)
        merged[:route_samples] = routed if routed.any?
        loaded = windows.filter_map { |w| w[:loaded] }
        if loaded.any?
          merged[:loaded] = { requests: loaded.sum { |l| l[:requests].to_i }, seconds: loaded.map { |l| Float(l[:seconds]) }.max }
        end
        waits = windows.select { |w| w[:io_waits] }
        if waits.any?
          weight = waits.sum { |w| w[:requests].to_i }
          merged[:io_waits] = (waits.sum { |w| w[:io_waits] * w[:requests].to_i }.to_f / [weight, 1].max).round(3)
        end
        handed = windows.select { |w| w[:gvl_handoff] && w[:gvl_handoffs].to_i.positive? }
        if handed.any?
          n = handed.sum { |w| w[:gvl_handoffs].to_i }
          merged[:gvl_handoff] = (handed.sum { |w| w[:gvl_handoff] * w[:gvl_handoffs].to_i } / n).round(9)
          merged[:gvl_handoffs] = n
        end
        %i[outside_cpu gvl_between idle_cpu_wait idle_send_wait idle_send_hidden cpu_per_request].each do |key| # per-process ratios, weighted by requests
          have = windows.select { |w| w[key] && w[:requests].to_i.positive? }
          next if have.empty?

          merged[key] = (have.sum { |w| w[key] * w[:requests].to_i } / have.sum { |w| w[:requests].to_i }).round(key == :cpu_per_request ? 9 : 4)
        end
        fits = windows.select { |w| w[:cpu_fit] && w[:requests].to_i.positive? }
        merged[:cpu_fit] = merge_fits(fits) if fits.any?
        speeds = windows.flat_map { |w| Array(w[:cpu_speed]) }
        merged[:cpu_speed] = speeds.last(SPEED_CAP) if speeds.any?
        slices = windows.filter_map { |w| w[:timeslice] }
        merged[:timeslice] = slices.max if slices.any?
        pools = windows.flat_map { |w| w[:db_pools] || [] }
        merged[:db_pools] = pools.uniq { |p| p[:name] } if pools.any?
        # a process's GC stops only its own requests: the worst process's
        gcs = windows.filter_map { |w| w[:gc] if w[:gc].is_a?(Hash) && w[:gc][:seconds].to_f.positive? }
        merged[:gc] = gcs.max_by { |g| g[:majors].to_f / g[:seconds].to_f } if gcs.any?
        merged
      end

      # The mean time the GVL stayed free when it passed to a waiting thread
      # (Native::GVL.global, since the hook started: handoffs are many and
      # their cost is the machine's, not the last minute's).
      def handoff(window)
        g = Native::GVL.global
        return unless g && g[4].to_i.positive?

        window[:gvl_handoff] = (g[3] / g[4] / 1e9).round(9)
        window[:gvl_handoffs] = g[4]
      end

      # The CPU's speed as the GVL's holders saw it, step by step over the
      # window (ext/serval/steadiness.c): CPU time / GVL time held, for the
      # steps in which the GVL was held at least SPEED_MIN_BUSY of the time
      # (in a quiet step a few short slices say little), oldest first, at
      # most 1 (CPU used outside the GVL is not the holder's). nil without
      # the hook or before SPEED_MIN_STEPS such steps since `from`.
      def cpu_speed(steadiness, from)
        step, steps = steadiness
        speeds = steps.filter_map do |at, held, cpu|
          next if at < from || held < SPEED_MIN_BUSY * step

          (cpu / held).clamp(SPEED_MIN, 1.0).round(3)
        end
        speeds.size >= SPEED_MIN_STEPS ? speeds : nil
      end

      # The process's CPU that no GVL holder used (ext/serval/steadiness.c:
      # the event loop, system calls made without the GVL, thread switches),
      # per second of GVL held, over the window's busy steps (held at least
      # SPEED_MIN_BUSY of the step: a quiet step's tickers say nothing of a
      # request's cost). nil without OUTSIDE_MIN_STEPS such steps that note
      # the process's CPU.
      #
      # Summed over the steps before the floor at 0, not step by step: a
      # slice counts in the step it ends in (ext/serval/steadiness.c), so a
      # step's held time runs a little ahead of or behind its CPU, and
      # keeping only the steps where the CPU came out ahead counted that
      # noise as CPU beyond the GVL (the request's run already holds it).
      def outside_cpu(steadiness, from)
        busy = busy_steps(steadiness, from, 4) or return nil
        held = busy.sum { |st| st[1] }
        ([busy.sum { |st| st[3] - st[1] }, 0.0].max / held).round(4)
      end

      CPU_COVER = 0.9 # the steps must span this share of the window for cpu_per_request

      # The whole process's CPU time (every thread: the requests', the event
      # loop's, Serval's own; ext/serval/steadiness.c) per request completed,
      # over the window's steps, seconds: what a request costs the process
      # in all, measured beside the requests' run. The advice caps the GVL
      # time it charges per request with it (Advice::Window#cpu_scale). nil
      # without the hook, without requests or when the sampler's steps do
      # not span CPU_COVER of the window (a fresh sampler, an older build).
      def cpu_per_request(steadiness, from, seconds, requests)
        return nil unless requests.positive? && seconds.to_f.positive?

        step, steps = steadiness
        steps = steps.select { |st| st.size >= 4 && st[0] >= from }
        return nil if steps.size * step < CPU_COVER * seconds

        (steps.sum { |st| st[3] } / requests).round(9)
      end

      CPU_FIT_MIN_STEPS = 40 # steps (10 s) with their requests counted, for cpu_fit

      # The process's CPU in each step regressed on the requests that ended
      # in it (least squares, ext/serval/steadiness.c's steps since `from`):
      # cpu = fixed x step + per_request x requests. `fixed` (CPU seconds a
      # second) is what the process spends whatever its rate - timers, the
      # sampler, idle wake-ups, a logger's flush thread; `per_request` the
      # CPU one more request adds. A window recorded at part load has
      # cpu_per_request = per_request + fixed / rate; at saturation the
      # requests have 1 - fixed of the CPU (Advice::Window#load_scale).
      # `se` is per_request's standard error; `inflight` the mean requests
      # in flight over the steps (their wall time / the steps' length);
      # `busy_p90` the 90th percentile of the steps' busy share (the
      # process's CPU or the GVL held, the larger, per second): near 1 the
      # process was saturated and its requests per step followed their cost,
      # not their arrivals, which the advice then does not fit on.
      # nil before CPU_FIT_MIN_STEPS steps that count requests (an older
      # build) or when every step saw as many requests (no spread to fit).
      def cpu_fit(steadiness, from)
        step, steps = steadiness
        steps = steps.select { |st| st.size >= 13 && st[0] >= from }
        return nil if steps.size < CPU_FIT_MIN_STEPS

        n = steps.map { |st| Float(st[11]) }
        y = steps.map { |st| Float(st[3]) }
        fit = least_squares(n, y) or return nil
        a, b, se = fit
        busy = steps.map { |st| [Float(st[3]), Float(st[1])].max / step }.sort
        { fixed: (a / step).round(4), per_request: b.round(9), se: se.round(9), steps: steps.size,
          requests: n.sum.to_i, inflight: (steps.sum { |st| Float(st[12]) } / (steps.size * step)).round(2),
          busy_p90: busy[(0.9 * (busy.size - 1)).round].round(4) }
      end

      # [intercept, slope, slope's standard error] of y on x; nil without
      # spread in x or with fewer than 3 points.
      def least_squares(x, y)
        k = x.size
        return nil if k < 3

        mx = x.sum / k
        my = y.sum / k
        sxx = x.sum { |v| (v - mx)**2 }
        return nil unless sxx.positive?

        b = x.each_index.sum { |i| (x[i] - mx) * (y[i] - my) } / sxx
        a = my - (b * mx)
        rss = x.each_index.sum { |i| (y[i] - a - (b * x[i]))**2 }
        [a, b, Math.sqrt(rss / (k - 2) / sxx)]
      end

      # Several processes' fits as one: each figure weighted by the
      # process's requests (fixed is per process, as the advice sizes one).
      def merge_fits(windows)
        weight = windows.sum { |w| w[:requests].to_i }
        avg = ->(key) { windows.sum { |w| w[:cpu_fit][key].to_f * w[:requests].to_i } / weight }
        { fixed: avg.call(:fixed).round(4), per_request: avg.call(:per_request).round(9), se: avg.call(:se).round(9),
          steps: windows.sum { |w| w[:cpu_fit][:steps].to_i }, requests: windows.sum { |w| w[:cpu_fit][:requests].to_i },
          inflight: avg.call(:inflight).round(2), busy_p90: windows.map { |w| w[:cpu_fit][:busy_p90].to_f }.max.round(4) }
      end

      # The GVL held outside any request (Serval's own work between requests:
      # picking one up, building its env, finishing the response; the app's
      # and libraries' threads) per second held inside requests, over the
      # window's busy steps: GVL capacity every request's run does not show.
      # nil without OUTSIDE_MIN_STEPS busy steps that note it.
      def gvl_between(steadiness, from)
        busy = busy_steps(steadiness, from, 5) or return nil
        inside = busy.sum { |st| [st[1] - st[4], 0.0].max }
        return nil unless inside.positive?

        (busy.sum { |st| [st[4], 0.0].max } / inside).round(4)
      end

      # The share of the requests' idle time in which the thread was ready
      # to run but waited for a CPU (runnable, not running: Linux schedstat,
      # read at both ends of one in-request idle span in 16 by the GVL hook,
      # ext/serval/gvl.c), over the window's steps: on a busy CPU a thread
      # whose I/O has finished waits for the CPU before it can ask for the
      # GVL, and the hook files that as idle. The advice model takes it out
      # of the I/O (Advice::Window). Less the wait that fell inside a send
      # whose answer was still out (the remote worked all the while), and
      # with idle_send_wait: the GVL waits after such sends when the wait for
      # the CPU made them too long for the link, which the hook files as
      # stall, per second of sampled idle (the model adds them to the I/O).
      # And with `sends` (Native::GVL.sends: the sampled sends by the time to
      # their answer's read), idle_send_hidden: the remote's time hidden in
      # GVL waits during which the answer came (Advice::HiddenRemote), per
      # second of sampled idle. { idle_cpu_wait:, idle_send_wait:,
      # idle_send_hidden: } or nil before IDLE_CPU_WAIT_MIN_SPANS spans.
      #
      # Sampled idle is what the histograms' idle holds for the sampled
      # spans: the spans themselves and the GVL waits the link filed into
      # idle after the sampled sends among them (figures 11 and 14), which
      # no span's length includes. Per second of the spans alone, the shares
      # would scale the filed waits too when the model multiplies the idle:
      # the more threads contend, the more I/O it would read.
      def idle_shares(steadiness, from, sends = nil)
        _step, steps = steadiness
        steps = steps.select { |st| st.size >= 8 && st[0] >= from }
        return nil if steps.sum { |st| st[7] } < IDLE_CPU_WAIT_MIN_SPANS

        spanned = steps.sum { |st| st[6] + (st[10] || 0.0) + (st[13] || 0.0) }
        return nil unless spanned.positive?

        in_sends = steps.sum { |st| st[8] || 0.0 }
        out = { idle_cpu_wait: ((steps.sum { |st| st[5] } - in_sends) / spanned).clamp(0.0, 0.99).round(4) }
        out[:idle_send_wait] = (steps.sum { |st| st[9] || 0.0 } / spanned).clamp(0.0, 10.0).round(4) if steps.any? { |st| st.size >= 10 }
        hidden = sends && Advice::HiddenRemote.seconds(answered: sends[0], in_wait: sends[1], times: sends[2])
        if hidden && steps.any? { |st| st.size >= 11 }
          # less the waits the link filed after such sends (their answer had come: more than the remote's time)
          out[:idle_send_hidden] = ((hidden - steps.sum { |st| st[10] || 0.0 }) / spanned).clamp(-1.0, 10.0).round(4)
        end
        out
      end

      def native_sends(from) = Native::GVL.respond_to?(:sends) ? Native::GVL.sends(from) : nil

      # The window's steps (since `from`) that note `fields` figures and in
      # which the GVL was held at least SPEED_MIN_BUSY of the step; nil when
      # fewer than OUTSIDE_MIN_STEPS.
      def busy_steps(steadiness, from, fields)
        step, steps = steadiness
        busy = steps.select { |st| st.size >= fields && st[0] >= from && st[1] >= SPEED_MIN_BUSY * step }
        busy.size < OUTSIDE_MIN_STEPS ? nil : busy
      end

      def native_steadiness = Native::GVL.respond_to?(:steadiness) ? Native::GVL.steadiness : nil

      # The sampled requests with their routes (Timing::Routes), drawn from
      # each 10 s bucket in proportion to its requests.
      def route_samples(now, rng)
        groups = Routes.buckets(now)
        rows, = uniform(groups.map(&:first), groups.map(&:last), CAP, rng)
        rows.map do |route, run, idle, stall, wall|
          { route: route, run: run.round(DIGITS), idle: idle.round(DIGITS), stall: stall.to_f.round(DIGITS),
            wall: wall&.round(DIGITS) }
        end
      end

      LOADED = 0.5 # a bucket is in the loaded period at this share of the busiest bucket's rate or more

      # The loaded period: the 10 s buckets whose rate is at least LOADED of
      # the busiest one's, {requests:, seconds:} - what the server served
      # while it was busy, not diluted by the idle rest of the minute. nil
      # without requests. The newest bucket is counted for the part of it
      # that has passed, the oldest for the part the window covers.
      def loaded(buckets, seconds, now)
        return nil if buckets.empty?

        span = WINDOW_SPAN
        spans = buckets.map { |b| (now - b[0]).clamp(0.0, span) } # newest first: only it is partial
        spans[-1] = [spans[-1], seconds - spans[0...-1].sum].min if buckets.size > 1
        rates = buckets.each_with_index.map { |b, i| spans[i] >= 1.0 ? b[1] / spans[i] : 0.0 }
        top = rates.max
        return nil unless top.positive?

        keep = rates.each_index.select { |i| rates[i] >= LOADED * top }
        { requests: keep.sum { |i| buckets[i][1] }, seconds: keep.sum { |i| spans[i] }.round(3) }
      end

      # Groups of samples, each drawn from `from[i]` requests: the same share
      # of every group (the smallest any group holds), at most cap in all.
      # Returns [samples, requests they stand for].
      def uniform(groups, from, cap, rng)
        shares = groups.each_with_index.filter_map { |g, i| g.size.to_f / from[i] if from[i].to_i.positive? }
        return [[], 0] if shares.empty?

        total = from.sum(&:to_i)
        rate = [shares.min, cap.to_f / total].min
        picked = groups.each_with_index.flat_map do |g, i|
          k = (from[i].to_i * rate).round.clamp(0, g.size)
          k == g.size ? g : g.sample(k, random: rng)
        end
        [picked, total]
      end

      ROW_BITS = 16 # a picked sample: bucket << ROW_BITS | its row in the bucket
      ROW_MASK = (1 << ROW_BITS) - 1
      # a sample's figures in the order it lists them, as [name, place in a native row]
      SPLIT_KEYS = %i[queue run idle stall pool_wait wall cpu lock].map { |k| [k, FIGURES.index(k)] }.freeze
      PLAIN_KEYS = %i[queue run idle cpu pool_wait wall].map { |k| [k, FIGURES.index(k)] }.freeze

      # Row `row` of a bucket's samples (flat: FIGURES.size values a row,
      # nil where not measured) as a Hash, rounded to DIGITS.
      def sample(bucket, row, keys, gvl_split)
        flat = bucket[6]
        at = row * FIGURES.size
        out = {}
        keys.each do |k, i|
          v = flat[at + i]
          out[k] = v.round(DIGITS) if v
        end
        shape = gvl_split && bucket[8] && bucket[8][row]
        out[:shape] = shape.map { |v| v.round(DIGITS) } if shape
        out
      end

      def histograms(bounds, counts, sums)
        FIGURES.each_with_index.each_with_object({}) do |(f, k), h|
          next if counts[k].sum.zero?

          h[f] = { bounds: bounds, counts: counts[k], sum: sums[k] }
        end
      end

      def add_histograms(windows)
        out = {}
        windows.each do |w|
          (w[:histograms] || {}).each do |f, hist|
            mine = out[f] ||= { bounds: hist[:bounds], counts: Array.new(hist[:counts].size, 0), sum: 0.0 }
            raise ArgumentError, "windows with different histogram bounds" unless mine[:bounds] == hist[:bounds]

            hist[:counts].each_with_index { |c, i| mine[:counts][i] += c }
            mine[:sum] += hist[:sum].to_f
          end
        end
        out
      end

      def symbolize(obj) = Keys.symbolize(obj)
    end
  end
end
