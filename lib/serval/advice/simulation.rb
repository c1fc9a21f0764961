# frozen_string_literal: true

require "serval/advice/quantile"
begin
  require "serval/native_ext" # Native::Sim: the loop compiled (ext/serval/sim.c)
rescue LoadError
  nil # not built: the same loop in Ruby (#play_ruby), several times slower
end

module Serval
  module Advice
    # A discrete-event model of one Ruby process serving requests.
    #
    # - The GVL is one server, granted in the order threads asked for it
    #   (order: :fifo), or to any one of the threads waiting when it comes
    #   free (order: :random: a woken waiter can lose the GVL to a thread
    #   that arrives while it is being scheduled). A thread holding it for a CPU segment keeps it until the
    #   segment ends, unless the segment outlasts the time slice (`quantum`,
    #   Ruby's 100 ms) while another thread waits: then, at the end of the
    #   slice, it goes to the back of the line with the rest of its segment.
    # - Between CPU segments a thread waits without the GVL (I/O, sleep, the
    #   database). Waits do not contend with each other - except, with
    #   `pool: P`, each wait needs one of P database connections, held for
    #   the wait (Active Record 7.2+ leases a connection per query); a thread
    #   that finds none free waits for the first to come back (pool_wait).
    # - A wait given as -R (Workload's joined waits: a send, a few
    #   microseconds holding the GVL, the wait for the answer) ends R after
    #   the previous wait began, or at once if that has passed: the remote
    #   worked while the thread waited for the GVL in between, and that
    #   stretch of the wait is not counted as stall (the GVL hook files it
    #   as idle too). A database connection is held from the first wait's
    #   start for R.
    # - `handoff`: seconds the GVL stays free when it passes to a thread that
    #   was waiting for it (the releaser wakes it, the kernel schedules it),
    #   as the GVL hook measures them; capacity lost on every contended grant.
    # - `speed` (open loop only): the CPU's measured speed, one figure per
    #   SPEED_STEP seconds (Window#replayed_speed), replayed in a loop from a
    #   random point: a CPU segment that starts at t lasts work / speed(t).
    #   The figures are scaled so that 1 / speed averages 1: the measured
    #   run times already contain the dips on average, so the replay keeps
    #   the model's capacity and adds only their clustering in time, which
    #   is what lengthens a queue's tail near capacity (a second at 60 %
    #   speed leaves a backlog that the following requests wait behind).
    #   Closed-loop throughput is a long-run mean and ignores it.
    # - `loop_cpu`: seconds of CPU per request that the rest of the process
    #   spends beyond the GVL's holders (the event loop reading the next
    #   request and writing the response, system calls without the GVL), on
    #   the same CPU. It falls due as each request ends and runs while the
    #   GVL is free (no one waits for it); what is still due when a thread
    #   is granted the GVL runs first, lengthening that thread's hold. At
    #   part load it hides in the GVL's idle time, at saturation every bit
    #   of it is taken from the holders.
    # - `between`: seconds per request a thread keeps the GVL after the
    #   response is out (finishing the request: timing, the connection's
    #   next step, Rack's response_finished callbacks - Rails' executor)
    #   before it can take another request. The request's latency ends
    #   before it; the next request, in a closed loop sent as soon as the
    #   response arrives, waits for it in the queue.
    # - `lock`: the share (0..1] of the waits a thread does holding the
    #   process's one Ruby lock (a Mutex or Monitor: Logger's, around its
    #   write), chosen per request and wait at random (seeded) - a local
    #   serialising resource, unlike I/O. A thread that ends a CPU segment
    #   before such a wait takes the lock if it is free; else it gives the
    #   GVL up and waits for the lock (lock_wait), in line. The holder keeps
    #   the lock through the wait and until it has the GVL again (it must
    #   run to unlock). Unlocking frees the lock and wakes the first in line
    #   (Ruby's Mutex: no hand-over, thread_sync.c), which asks for the GVL
    #   and, once it has it, takes the lock if it is still free - a thread
    #   that had the GVL first may have taken it - or goes to the back of
    #   the line again. So the lock is held longer the longer the GVL queue
    #   is, and more threads wait longer for it (lib/serval/advice/lock.rb
    #   picks the share that reproduces the measured lock waits).
    # - `lock_within`: nil, or the longest wait (seconds) the lock is held
    #   through: a logger holds its lock through its writes, not through
    #   the request's database round trips.
    # - `scale`: every CPU segment that many times as long (what if the
    #   requests computed a little more or less: Recommender#precision).
    # - `threads` request threads. Closed loop (#closed): as many clients as
    #   threads, no think time - the saturated throughput of that thread
    #   count. Open loop (#open): Poisson arrivals at `rate`; a request waits
    #   in the queue for a free thread.
    #
    # Profiles (from Workload#profiles) are [cpu, io, cpu, ..., cpu] seconds;
    # every run replays the same profiles in the same order, so two thread
    # counts are compared on the same requests (common random numbers) and
    # results are reproducible.
    #
    # The loop needs no event heap: GVL grants happen in time order, so the
    # next event is always "a thread that is waiting gets the GVL" (the one
    # that asked first, or a random waiter), and pool checkouts, which follow
    # GVL releases, are also in time order.
    #
    # `engine`: :native runs the loop compiled (ext/serval/sim.c, the
    # default when the extension is built), :ruby runs #play_ruby. Both give
    # the same figures to the last bit (test/advice/native_sim_test.rb); the
    # Ruby loop is the readable one, and a change to the model goes into
    # both.
    class Simulation
      QUANTUM = 0.1
      SPEED_STEP = 0.25

      Result = Struct.new(:threads, :requests, :rps, :latency_p50, :latency_p99, :wall_p50, :wall_p99,
                          :stall_mean, :stall_p95, :stall_max, :pool_wait_mean, :queue_mean, :gvl_busy,
                          :lock_wait_mean, :lock_waited, keyword_init: true) do
        def to_h = super.transform_values { |v| v.is_a?(Float) ? v.round(6) : v }
      end

      attr_reader :profiles

      ORDERS = %i[fifo random].freeze

      ENGINES = %i[native ruby].freeze

      # The engine a Simulation runs by default.
      def self.default_engine = defined?(Serval::Native::Sim) ? :native : :ruby

      def initialize(profiles, quantum: QUANTUM, pool: nil, order: :fifo, seed: 1, handoff: 0.0, speed: nil, scale: 1.0,
                     loop_cpu: 0.0, between: 0.0, lock: nil, lock_within: nil, engine: Simulation.default_engine)
        raise ArgumentError, "no request profiles" if profiles.empty?
        raise ArgumentError, "engine is one of #{ENGINES.join(', ')}" unless ENGINES.include?(engine)
        raise ArgumentError, "the native engine needs the compiled extension" if engine == :native && !defined?(Serval::Native::Sim)
        raise ArgumentError, "quantum must be > 0" unless quantum.positive?
        raise ArgumentError, "pool must be an Integer >= 1" unless pool.nil? || (pool.is_a?(Integer) && pool >= 1)

        raise ArgumentError, "order is one of #{ORDERS.join(', ')}" unless ORDERS.include?(order)

        @profiles = profiles
        @quantum = quantum
        @order = order
        @seed = seed
        @pool = pool
        @handoff = Float(handoff)
        raise ArgumentError, "handoff must be >= 0" if @handoff.negative?

        @speed = speed && normalized(speed)
        @scale = Float(scale)
        raise ArgumentError, "scale must be > 0" unless @scale.positive?

        @loop_cpu = Float(loop_cpu)
        @between = Float(between)
        raise ArgumentError, "loop_cpu and between must be >= 0" if @loop_cpu.negative? || @between.negative?

        @lock = lock && Float(lock)
        raise ArgumentError, "lock must be a share in (0, 1]" if @lock && !(@lock > 0 && @lock <= 1)

        @lock_within = lock_within && Float(lock_within)
        raise ArgumentError, "lock_within must be > 0" if @lock_within && !@lock_within.positive?

        @engine = engine
        @options = { quantum: quantum, pool: pool, order: order, seed: seed, handoff: handoff, speed: speed,
                     loop_cpu: loop_cpu, between: between, lock: lock, lock_within: lock_within, engine: engine }
      end

      # The same requests with every CPU segment `factor` times as long.
      def scaled(factor) = Simulation.new(@profiles, **@options, scale: @scale * factor).share_packed(self)

      # Saturated: `threads` clients, each sending its next request as soon
      # as the previous one is answered.
      def closed(threads)
        play(check(threads), nil, nil)
      end

      # Poisson arrivals at `rate` req/s (seeded by `rng`).
      def open(threads, rate:, rng: Random.new(1))
        raise ArgumentError, "rate must be > 0" unless rate.positive?

        arrivals = if @engine == :native
                     Native::Sim.arrivals(@profiles.size, rate, rng) # packed, the same draws
                   else
                     t = 0.0
                     Array.new(@profiles.size) { t += -Math.log(1.0 - rng.rand) / rate }
                   end
        offset = @speed ? rng.rand * @speed.size * SPEED_STEP : 0.0
        play(check(threads), arrivals, offset)
      end

      protected

      # Packed profiles by the profiles Array (identity): the simulations of
      # one advice share them (the lock's calibration plays the same
      # profiles a dozen times).
      PACKED = ObjectSpace::WeakMap.new

      # The profiles packed for the native loop: [segments, offsets].
      def packed
        @packed ||= PACKED[@profiles] ||= [@profiles.flatten.pack("d*"),
                                           @profiles.each_with_object([0]) { |p, o| o << (o.last + p.size) }.pack("q*")]
      end

      # A scaled copy plays the same requests with the same locked waits.
      def share_packed(other)
        @packed = other.packed if @engine == :native
        @lock_marks = other.lock_marks if @engine == :native && @lock
        self
      end

      # #locked_waits as the native loop takes them, drawn from the same
      # stream in the same order: a byte per segment, 1 where that wait
      # holds the lock; nil without a lock.
      def lock_marks
        return nil unless @lock

        @lock_marks ||= Native::Sim.marks(*packed, Random.new(@seed + 7), @lock, @lock_within)
      end

      private

      def play(threads, arrivals, offset)
        return play_ruby(threads, arrivals, offset) if @engine == :ruby

        segs, offs = packed
        finished, lat, wall, stall, pwait, queue, lock, busy =
          Native::Sim.play(segs, offs, lock_marks, threads, arrivals,
                           [@quantum, @handoff, @scale, @loop_cpu, @between, offset || 0.0, SPEED_STEP, @pool || 0],
                           offset && @speed&.pack("d*"), @order == :random ? Random.new(@seed) : nil)
        summarize(threads, Packed.new({ finished: finished, latency: lat, wall: wall, stall: stall, pool_wait: pwait,
                                        queue: queue, lock: lock }), busy)
      end

      # Per profile, which of its waits hold the lock: nil (none) or an
      # Array of booleans by wait (#play). Seeded: every thread count and
      # every run sees the same choice. With lock_within, only waits of at
      # most that many seconds can (a joined wait counts whole).
      def locked_waits
        @locked_waits ||= begin
          rng = Random.new(@seed + 7)
          q = @lock
          within = @lock_within
          @profiles.map do |p|
            marks = Array.new(p.size / 2) { |j| rng.rand < q && (within.nil? || p[(2 * j) + 1].abs <= within) }
            marks.any? ? marks : nil
          end
        end
      end

      def normalized(list)
        speeds = list.map { |v| Float(v) }
        raise ArgumentError, "speed is a non-empty Array of figures > 0" if speeds.empty? || !speeds.all?(&:positive?)

        harmonic = speeds.size / speeds.sum { |v| 1.0 / v }
        speeds.map { |v| v / harmonic }
      end

      def check(threads)
        raise ArgumentError, "threads must be an Integer >= 1" unless threads.is_a?(Integer) && threads >= 1

        threads
      end

      def play_ruby(threads, arrivals, offset)
        n = @profiles.size
        inf = Float::INFINITY
        quantum = @quantum
        handoff = @handoff
        ready = Array.new(threads, inf) # when each thread next asks for the GVL
        prof = Array.new(threads)
        seg = Array.new(threads, 0)
        rem = Array.new(threads, 0.0)   # CPU left in the current segment
        arrived = Array.new(threads, 0.0)
        began = Array.new(threads, 0.0)
        stall = Array.new(threads, 0.0)
        asked = Array.new(threads, 0.0)   # the last grant: when the thread asked,
        granted = Array.new(threads, 0.0) # and when it got the GVL
        iostart = Array.new(threads, 0.0) # when its last wait began
        pwait = Array.new(threads, 0.0)
        pool = @pool && Array.new(@pool, 0.0)
        finished = []
        lat_out = []
        wall_out = []
        stall_out = []
        pwait_out = []
        queue_out = []
        nxt = 0
        gvl_free = 0.0
        busy = 0.0
        pick = @order == :random && Random.new(@seed)
        speeds = offset && @speed
        nspeeds = speeds ? speeds.size : 1
        step = SPEED_STEP
        profiles = @profiles
        scale = @scale
        loop_cpu = @loop_cpu
        between = @between
        due = 0.0 # loop_cpu not yet run (class comment)
        locked = @lock && locked_waits
        holder = nil                   # the lock's holder (class comment): it unlocks at its next grant
        line = []                      # threads waiting for the lock, first first
        lfrom = Array.new(threads, 0.0)
        lwait = Array.new(threads, 0.0)
        pidx = Array.new(threads, 0)   # the index of each thread's profile (locked waits)
        lock_out = []

        threads.times do |i|
          break if nxt >= n

          arr = arrivals ? arrivals[nxt] : 0.0
          prof[i] = @profiles[nxt]
          pidx[i] = nxt
          rem[i] = (prof[i][0] * scale) + (prof[i].size == 1 ? between : 0.0)
          arrived[i] = began[i] = ready[i] = arr
          nxt += 1
        end

        loop do
          t = ready.min
          break if t == inf

          i = ready.index(t)
          if pick && t < gvl_free
            waiting = []
            ready.each_with_index { |r, j| waiting << j if r <= gvl_free }
            if waiting.size > 1
              i = waiting[pick.rand(waiting.size)]
              t = ready[i]
            end
          end
          start = gvl_free > t ? gvl_free + handoff : t
          if due.positive? # the loop's work ran while the GVL was free; the rest runs first on this grant
            due -= start - gvl_free if start > gvl_free
            rem[i] += due if due.positive?
            due = 0.0
          end
          stall[i] += start - t
          asked[i] = t
          granted[i] = start
          if holder == i # back with the GVL after its locked wait: unlocks and wakes the first in line
            holder = nil
            if (w = line.shift) # woken: it asks for the GVL and tries again (class comment)
              lwait[w] += start - lfrom[w]
              ready[w] = start
            end
          end
          c = rem[i] # work left; at speed sp it takes c / sp
          sp = speeds ? speeds[((start + offset) / step).floor % nspeeds] : 1.0
          c /= sp if speeds
          if c > quantum
            ready[i] = inf
            other = ready.min
            ready[i] = t
            if other < start + c
              k = other <= start ? 1 : ((other - start) / quantum).ceil
              cut = start + (k * quantum)
              if cut < start + c
                busy += cut - start
                gvl_free = cut
                rem[i] = (c - (cut - start)) * sp
                ready[i] = cut
                next
              end
            end
          end
          gvl_free = start + c
          busy += c
          s = seg[i] + 1
          p = prof[i]
          if s >= p.size
            done = gvl_free - between # the response is out; the thread finishes the request
            done = start if done < start
            due += loop_cpu
            finished << done
            lat_out << (done - arrived[i])
            lock_out << lwait[i]
            wall_out << (done - began[i])
            stall_out << stall[i]
            pwait_out << pwait[i]
            queue_out << (began[i] - arrived[i])
            if nxt < n # the thread takes the next request: at once, or when it arrives
              arr = arrivals ? arrivals[nxt] : done
              prof[i] = p = profiles[nxt]
              pidx[i] = nxt
              nxt += 1
              seg[i] = 0
              rem[i] = (p[0] * scale) + (p.size == 1 ? between : 0.0)
              arrived[i] = arr
              began[i] = ready[i] = arr > gvl_free ? arr : gvl_free
              stall[i] = pwait[i] = lwait[i] = 0.0
            else
              ready[i] = inf
            end
          else
            if locked && (marks = locked[pidx[i]]) && marks[s / 2]
              if holder.nil? # free: taken, by a woken thread or one that comes to it first
                holder = i
              else # in line for the lock (at the back, a woken one too), without the GVL; its wait still to come
                lfrom[i] = gvl_free
                line << i
                ready[i] = inf
                rem[i] = 0.0
                next
              end
            end
            io = p[s]
            if io.negative? # joined to the previous wait (class comment)
              fin = iostart[i] - io
              overlap = (fin < granted[i] ? fin : granted[i]) - asked[i]
              stall[i] -= overlap if overlap.positive?
              iostart[i] = gvl_free
              ready[i] = fin > gvl_free ? fin : gvl_free
            elsif pool
              k = pool.index(pool.min)
              at = pool[k] > gvl_free ? pool[k] : gvl_free
              pwait[i] += at - gvl_free
              joined = p[s + 2]
              pool[k] = at + (joined && joined.negative? ? -joined : io)
              iostart[i] = at
              ready[i] = at + io
            else
              iostart[i] = gvl_free
              ready[i] = gvl_free + io
            end
            seg[i] = s + 1
            rem[i] = (p[s + 1] * scale) + (s + 2 == p.size ? between : 0.0)
          end
        end
        summarize(threads, Figures.new({ finished: finished, latency: lat_out, wall: wall_out, stall: stall_out,
                                         pool_wait: pwait_out, queue: queue_out, lock: lock_out }), busy)
      end

      # Figures over the steady part: the first tenth of the requests warm up
      # (threads start in step), the last `threads` drain with fewer clients.
      # out: by key (finished, latency, wall, ...), one figure per request
      # in finishing order, as Figures (Ruby Arrays) or Packed (the native
      # loop's).
      def summarize(threads, out, busy)
        n = out.size
        from = n / 10
        to = [n - threads, from + 1].max
        to = n - 1 if to >= n
        span = out.at(:finished, to) - out.at(:finished, from)
        rps = span.positive? ? (to - from) / span : Float::INFINITY
        size = to - from + 1
        quantiles = lambda do |key, *qs|
          ranks = qs.map { |q| Advice.quantile_ranks(size, q) }
          values = out.order(key, from, to, ranks.flat_map { |lo, hi, _| [lo, hi] })
          ranks.each_with_index.map { |(_, _, w), k| Advice.interpolate(values[2 * k], values[(2 * k) + 1], w) }
        end
        lat50, lat99 = quantiles.call(:latency, 0.5, 0.99)
        wall50, wall99 = quantiles.call(:wall, 0.5, 0.99)
        st95, st_max = quantiles.call(:stall, 0.95, 1.0)
        last = out.at(:finished, n - 1)
        Result.new(threads: threads, requests: size, rps: rps,
                   latency_p50: lat50, latency_p99: lat99, wall_p50: wall50, wall_p99: wall99,
                   stall_mean: out.sum(:stall, from, to) / size, stall_p95: st95, stall_max: st_max,
                   pool_wait_mean: out.sum(:pool_wait, from, to) / size, queue_mean: out.sum(:queue, from, to) / size,
                   lock_wait_mean: @lock ? out.sum(:lock, from, to) / size : nil,
                   lock_waited: @lock ? out.positive(:lock, from, to).fdiv(size) : nil,
                   gvl_busy: last.positive? ? busy / last : 0.0)
      end

      # A run's figures by key, one Array each (#play_ruby).
      class Figures
        def initialize(lists) = @lists = lists
        def size = @lists[:finished].size
        def at(key, i) = @lists[key][i]
        def sum(key, from, to) = @lists[key][from..to].sum

        def positive(key, from, to) = @lists[key][from..to].count(&:positive?)

        # The values at these ranks of the slice sorted.
        def order(key, from, to, ranks)
          sorted = @lists[key][from..to].sort
          ranks.map { |r| sorted[r] }
        end
      end

      # The native loop's figures: packed doubles by key, read in C
      # (Native::Sim.order, .sum, .positive - the same values Figures gives).
      class Packed
        def initialize(strings) = @strings = strings
        def size = @strings[:finished].bytesize / 8
        def at(key, i) = @strings[key].unpack1("d", offset: 8 * i)
        def sum(key, from, to) = Native::Sim.sum(@strings[key], from, to)
        def positive(key, from, to) = Native::Sim.positive(@strings[key], from, to)
        def order(key, from, to, ranks) = Native::Sim.order(@strings[key], from, to, ranks)
      end
    end
  end
end
