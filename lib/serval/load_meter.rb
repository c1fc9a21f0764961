# frozen_string_literal: true

module Serval
  # One process's load over a sliding window, from samples someone takes
  # (Cluster::Balancer every 0.1 s; Capacity in single mode on each query):
  # the share of the window some thread held the GVL, the mean number of
  # threads running a request, and how many requests the core shed.
  class LoadMeter
    def initialize(window)
      @window = window
      @samples = [] # [monotonic s, GVL-held s, busy threads, shed count]
    end

    # GVL-held seconds of this process so far: the hook's total (Ruby 3.2+
    # with timing on), else the process's CPU time (near it for Ruby code).
    def self.gvl_held
      global = Native::GVL.enabled? ? Native::GVL.global : nil
      global ? global[0] / 1e9 : Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    end

    # Samples a Server: [busy threads, open connections, shed count, max_threads].
    def self.server_figures(server)
      core = server.core.stats
      pool = server.thread_pool.stats
      [pool[:busy_threads], core[:connections], core.fetch(:shed, 0), pool[:max_threads]]
    end

    def add(now, held, busy, shed)
      @samples << [now, held, busy, shed]
      @samples.shift while @samples.size > 2 && now - @samples[1][0] >= @window
    end

    # [GVL utilization 0..1, mean busy threads, requests shed] over the window.
    def figures
      first = @samples.first
      last = @samples.last
      return [0.0, 0.0, 0] unless first && last

      span = last[0] - first[0]
      util = span.positive? ? ((last[1] - first[1]) / span).clamp(0.0, 1.0) : 0.0
      [util, @samples.sum { |s| s[2] } / @samples.size.to_f, last[3] - first[3]]
    end
  end
end
