# frozen_string_literal: true

require "serval/advice/distribution"

module Serval
  module Advice
    # What one request asks of a process: its time holding the GVL (run) and
    # its time waiting without it (io: I/O, sleep, database), turned into the
    # segment lists the Simulation plays: [cpu, io, cpu, io, ..., cpu].
    #
    # A request with io_waits = k is k + 1 CPU segments around k waits; its
    # run and io totals are split evenly (split: :equal) or at uniformly
    # random points (split: :random, for bursty requests). The GVL hook does
    # not count the waits per request yet, so k defaults to 1: one block of
    # Ruby, one wait, the response written after it.
    #
    # Totals come from `pairs` ([[run, io], ...], one per measured request,
    # so a slow query and a long render stay in the same request) or, when
    # only histograms exist, from independent draws of `run` and `io`.
    #
    # A pair may carry a third element, the request's measured shape
    # ([held, idle, ..., held] seconds, from the GVL hook): that request is
    # then played as it ran - its real number of waits, a 20 us socket write
    # beside a 6 ms query - rescaled so its held spans sum to run and its
    # idle spans to io. The even split misses what that changes: a short
    # wait still gives the GVL away and queues again behind the others.
    #
    # Joined waits (the link, ext/serval/gvl.c): a short idle span (a send),
    # a short held span, then an idle span is one remote operation - the
    # database works while the sender waits for the GVL back. Such a second
    # span is played as -R, R the remote's seconds from the start of the
    # first: the Simulation has the thread ask again at start + R, however
    # long its own wait for the GVL in between was.
    #
    # `tail_cpu`: seconds of CPU per request that a process with one CPU
    # spends beyond the GVL's holders (its event loop, system calls without
    # the GVL), which at saturation is taken from the holders (Window#tail_cpu
    # says how much); `between`: seconds per request a thread holds the GVL
    # outside the request's measured span (Window#between_cpu). Neither is in
    # the profiles: the Simulation plays them (#sim_options).
    #
    # `lock`: the share of the waits played holding the process's Ruby lock
    # (Simulation's `lock`; Advice::Lock picks it from the measured lock
    # waits), nil for none. The measured lock waits themselves are in no
    # profile: like stall they are what threads do to each other, which
    # the Simulation plays for each thread count.
    class Workload
      LINK_SEND_MAX = 200e-6 # = Native::GVL::LINK_SEND_MAX (test/gvl_test.rb checks)
      LINK_RUN_MAX = 100e-6  # = Native::GVL::LINK_RUN_MAX

      attr_reader :io_waits, :split, :tail_cpu, :between, :lock

      def initialize(run: nil, io: nil, pairs: nil, io_waits: 1, split: :equal, tail_cpu: 0.0, between: 0.0)
        @pairs = pairs&.map { |r, i, shape| shape ? [Float(r), Float(i), shape_of(shape)] : [Float(r), Float(i)] }
        @run = Distribution.from(run)
        @io = Distribution.from(io)
        raise ArgumentError, "a workload needs pairs or run and io distributions" unless @pairs&.any? || (@run && @io)
        raise ArgumentError, "split is :equal or :random" unless %i[equal random].include?(split)

        @io_waits = Float(io_waits) # a mean: 1.9 = 1 wait for one request in ten, 2 for nine
        raise ArgumentError, "io_waits must be >= 0" if @io_waits.negative?

        @split = split
        @tail_cpu = Float(tail_cpu)
        @between = Float(between)
        raise ArgumentError, "tail_cpu and between must be >= 0" if @tail_cpu.negative? || @between.negative?
      end

      # The same requests with `seconds` of the process's CPU beyond the GVL
      # per request, and `between` seconds of GVL held after each.
      def with_tail(seconds, between: @between)
        copy = dup
        copy.instance_variable_set(:@tail_cpu, Float(seconds))
        copy.instance_variable_set(:@between, Float(between))
        raise ArgumentError, "tail_cpu and between must be >= 0" if copy.tail_cpu.negative? || copy.between.negative?

        copy
      end

      # The same requests with `share` of their waits held under the lock
      # (nil: none); `within`: only waits of at most that many seconds
      # (Simulation's lock_within).
      def with_lock(share, within: nil)
        raise ArgumentError, "lock must be a share in (0, 1]" if share && !(share.positive? && share <= 1)

        copy = dup
        copy.instance_variable_set(:@lock, share && Float(share))
        copy.instance_variable_set(:@lock_within, share && within && Float(within))
        copy
      end

      # What Simulation.new takes from this workload beside its profiles.
      def sim_options
        opts = { loop_cpu: @tail_cpu, between: @between }
        opts[:lock] = @lock if @lock
        opts[:lock_within] = @lock_within if @lock && @lock_within
        opts
      end

      # Mean CPU segments per request: the GVL grants one request asks for.
      def mean_segments
        @mean_segments ||= if @pairs&.any? { |p| p[2] }
                             @pairs.sum { |p| p[2] ? (p[2].size + 1) / 2 : @io_waits + 1 } / @pairs.size.to_f
                           else
                             @io_waits + 1
                           end
      end

      # The same requests with every wait multiplied by factor.
      def scale_io(factor)
        scaled = if @pairs
                   Workload.new(pairs: @pairs.map { |r, i, shape| [r, i * factor, shape] }, io_waits: @io_waits,
                                split: @split, tail_cpu: @tail_cpu, between: @between)
                 else
                   Workload.new(run: @run, io: ScaledDistribution.new(@io, factor), io_waits: @io_waits, split: @split,
                                tail_cpu: @tail_cpu, between: @between)
                 end
        @lock ? scaled.with_lock(@lock, within: @lock_within) : scaled
      end

      # The same requests with every run (and its held spans) multiplied by
      # factor: Window#cpu_scale.
      def scale_run(factor)
        scaled = if @pairs
                   Workload.new(pairs: @pairs.map { |r, i, shape| [r * factor, i, shape] }, io_waits: @io_waits,
                                split: @split, tail_cpu: @tail_cpu, between: @between)
                 else
                   Workload.new(run: ScaledDistribution.new(@run, factor), io: @io, io_waits: @io_waits, split: @split,
                                tail_cpu: @tail_cpu, between: @between)
                 end
        @lock ? scaled.with_lock(@lock, within: @lock_within) : scaled
      end

      # Mean seconds per request holding the GVL / waiting without it.
      def mean_run = @mean_run ||= @pairs ? @pairs.sum(&:first) / @pairs.size : @run.mean
      def mean_io = @mean_io ||= @pairs ? @pairs.sum { |p| p[1] } / @pairs.size : @io.mean

      # Share of a request's own time (run + io) that holds the GVL.
      def cpu_share
        total = mean_run + mean_io
        total.positive? ? mean_run / total : 1.0
      end

      # How well the requests' run / io ratio is known from `basis` requests
      # (the pairs' count unless more requests back the means): the relative
      # half-width of its 95 % interval by the delta method on the paired
      # means (var(R) ~ (var run - 2R cov + R^2 var io) / n / mean_io^2,
      # the pairs' correlation kept: a request with a long query often
      # renders long too), capped at 0.5. nil without pairs, with fewer than
      # 30, or no io. Cheap (one pass), so the advice can afford it at every
      # check; a 2,000-draw bootstrap agrees to within a tenth of it
      # (test/advice/range_test.rb).
      def ratio_within(basis: nil)
        return nil unless @pairs && @pairs.size >= 30 && mean_io.positive? && mean_run.positive?

        n = @pairs.size
        r = mean_run / mean_io
        var = @pairs.sum { |run, io| ((run - mean_run) - (r * (io - mean_io)))**2 } / (n - 1)
        m = [basis.to_i, n].max
        [1.96 * Math.sqrt(var / m) / mean_io / r, 0.5].min
      end

      # n request profiles, reproducible for a given rng. A measured request
      # drawn again is the same profile (the same Array: the Simulation only
      # reads them), reshaped once.
      def profiles(n, rng)
        shaped = {}.compare_by_identity
        Array.new(n) do
          run, io, shape = pair = totals(rng)
          shape ? (shaped[pair] ||= reshape(shape, run, io)) : segments(run, io, rng)
        end
      end

      # Share of the requests played with their measured shape.
      def shaped_share
        @pairs ? @pairs.count { |p| p[2] }.fdiv(@pairs.size) : 0.0
      end

      private

      def shape_of(shape)
        spans = Array(shape).map { |v| Float(v) }
        raise ArgumentError, "a shape is [held, idle, ..., held]: an odd number of spans >= 0" if spans.empty? || spans.size.even? || spans.any?(&:negative?)

        spans
      end

      # The measured spans rescaled to this request's totals.
      def reshape(shape, run, io)
        held = 0.0
        idle = 0.0
        shape.each_with_index { |v, i| i.even? ? held += v : idle += v }
        return segments_equal(run, io, shape.size / 2) unless held.positive? && (idle.positive? || io.zero?)

        fh = run / held
        fi = idle.positive? ? io / idle : 0.0
        link(shape, shape.each_with_index.map { |v, i| i.even? ? v * fh : v * fi })
      end

      # Marks joined waits in out (the scaled shape) as -R, judged on the
      # measured spans as the hook judged them.
      def link(shape, out)
        raw = out.dup
        (3...(shape.size - 1)).step(2) do |i|
          next unless shape[i - 1] < LINK_RUN_MAX && shape[i - 2] <= LINK_SEND_MAX

          out[i] = -(raw[i - 2] + raw[i - 1] + raw[i])
        end
        out
      end

      def segments_equal(run, io, k)
        return [run] if k.zero? || !io.positive?

        out = [run / (k + 1)]
        k.times { out << io / k << run / (k + 1) }
        out
      end

      def totals(rng)
        return @pairs[rng.rand(@pairs.size)] if @pairs

        [@run.draw(rng), @io.draw(rng)]
      end

      def segments(run, io, rng)
        k = io.positive? ? waits(rng) : 0
        return [run] if k.zero?

        cpus = parts(run, k + 1, rng)
        ios = parts(io, k, rng)
        out = [cpus[0]]
        k.times { |j| out << ios[j] << cpus[j + 1] }
        out
      end

      # A whole number of waits whose mean over requests is io_waits; a
      # request with I/O has at least one.
      def waits(rng)
        whole = @io_waits.floor
        frac = @io_waits - whole
        whole += 1 if frac.positive? && rng.rand < frac # no draw for a whole mean: same stream as before
        [whole, 1].max
      end

      def parts(total, n, rng)
        return Array.new(n, total / n) if @split == :equal || n == 1

        cuts = Array.new(n - 1) { rng.rand * total }.sort
        edges = [0.0, *cuts, total]
        edges.each_cons(2).map { |a, b| b - a }
      end
    end
  end
end
