# frozen_string_literal: true

module Serval
  module Advice
    # The remote's time a GVL wait hid. A request that sends (a query, an
    # HTTP call) gives the GVL away, asks for it back and, if other threads
    # hold it, waits; when the answer comes during that wait, the read that
    # follows returns at once and the hook (ext/serval/gvl.c) files nothing
    # of the remote's time as idle: the wait shows as stall. The more threads
    # contend, the more of the I/O disappears this way.
    #
    # What is known of such a send is T, the time from the send to the read
    # of its answer, and whether the answer was already in by then: for one
    # the remote took R < T, for another R > T. That is "current status"
    # data; with T independent of R (T is set by the GVL's other holders,
    # not by the remote), the share of sends found answered at T estimates
    # P(R < T). Sends that are not remote at all (a stat() among local system
    # calls, which looks the same to the hook) are found answered at any T:
    # their share is the floor p0, read where T is too short for a remote's
    # answer (LOCAL_MAX). So, with the answered share fitted non-decreasing
    # in T (pool-adjacent violators, weighted by count):
    #
    #   F(t) = (p(t) - p0) / (1 - p0)            the remote's time, t below T
    #   hidden(T) = (1 - p0) x integral_0^T (F(T) - F(r)) dr   = E[R; R < T]
    #
    # summed over the sends of each bin (F piecewise linear through (0, 0)
    # and the bins' mean T). gvl.c counts the sends of one idle span in 16
    # at random (its sampled spans), so the sum, per second of sampled idle,
    # is the share of idle the model adds back (Timing::Window's
    # idle_send_hidden).
    module HiddenRemote
      LOCAL_MAX = 0.000128 # seconds: sends answered by then tell local calls (p0), not remotes
      MIN_SENDS = 30       # fewer sampled sends: no estimate

      module_function

      # answered / in_wait: counts per bin (answer still out at the read /
      # already in); times: seconds summed per bin. Seconds of remote time
      # hidden in all those sends, or nil with fewer than MIN_SENDS.
      def seconds(answered:, in_wait:, times:)
        bins = answered.each_index.filter_map do |i|
          n = answered[i].to_i + in_wait[i].to_i
          [times[i].to_f / n, n, in_wait[i].to_i] if n.positive?
        end
        return nil if bins.sum { |b| b[1] } < MIN_SENDS

        fit = nondecreasing(bins.map { |_t, n, c| c.to_f / n }, bins.map { |_t, n, _c| n })
        p0 = floor(bins, fit)
        return 0.0 if p0 >= 1.0 - 1e-9

        f = fit.map { |p| ((p - p0) / (1.0 - p0)).clamp(0.0, 1.0) }
        area = 0.0 # integral_0^t F, through (0, 0) and the bins in order of t
        prev_t = 0.0
        prev_f = 0.0
        bins.each_with_index.sum do |(t, n, _c), i|
          area += (t - prev_t) * (prev_f + f[i]) / 2.0
          prev_t = t
          prev_f = f[i]
          n * (1.0 - p0) * [(f[i] * t) - area, 0.0].max
        end
      end

      # The local floor: the fitted share answered where T < LOCAL_MAX
      # (weighted), or the first bin's when no send was that quick.
      def floor(bins, fit)
        quick = bins.each_index.select { |i| bins[i][0] < LOCAL_MAX }
        return fit.first if quick.empty?

        quick.sum { |i| fit[i] * bins[i][1] } / quick.sum { |i| bins[i][1] }
      end

      # Weighted least-squares non-decreasing fit (pool adjacent violators).
      def nondecreasing(values, weights)
        blocks = [] # [mean, weight, size]
        values.each_with_index do |v, i|
          blocks << [v, weights[i].to_f, 1]
          while blocks.size > 1 && blocks[-2][0] > blocks[-1][0]
            b = blocks.pop
            a = blocks.pop
            w = a[1] + b[1]
            blocks << [((a[0] * a[1]) + (b[0] * b[1])) / w, w, a[2] + b[2]]
          end
        end
        blocks.flat_map { |mean, _w, size| [mean] * size }
      end
    end
  end
end
