# frozen_string_literal: true

module Serval
  # One process's load over a sliding window, from samples someone takes
  # (Cluster::Balancer every 0.1 s; Capacity in single mode on each query):
  # the share of the window some thread held the GVL, the mean number of
  # requests in the process (queued or running), and how many it shed.
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

    # Samples a Server: [request seconds (nil with timing off), busy
    # threads now, open connections, shed count, max_threads].
    def self.server_figures(server)
      core = server.core.stats
      pool = server.thread_pool.stats
      seconds = server.options[:timing] ? request_seconds : nil
      [seconds, pool[:busy_threads], core[:connections], core.fetch(:shed, 0), pool[:max_threads]]
    end

    # Seconds every finished request of this process spent queued in Serval
    # and in the app, summed (the timing aggregates): its growth over a window
    # divided by the window is the mean number of requests in the process.
    def self.request_seconds
      aggregate = Timing.aggregate
      aggregate[4] + aggregate[1][0]
    end

    # request_seconds: the running total above, or nil to integrate the
    # busy threads seen at each sample instead. A sampling thread needs the
    # GVL to run, which it gets when a request thread releases it, often as
    # a request ends, so samples see fewer busy threads than there are: the
    # total is preferred whenever timing is on.
    def add(now, held, busy, shed, request_seconds: nil)
      last = @samples.last
      request_seconds ||= last ? last[2] + (busy * (now - last[0])) : 0.0
      @samples << [now, held, request_seconds, shed]
      @samples.shift while @samples.size > 2 && now - @samples[1][0] >= @window
    end

    # [GVL utilization 0..1, mean requests in the process, requests shed]
    # over the window.
    def figures
      first = @samples.first
      last = @samples.last
      return [0.0, 0.0, 0] unless first && last

      span = last[0] - first[0]
      return [0.0, 0.0, last[3] - first[3]] unless span.positive?

      [((last[1] - first[1]) / span).clamp(0.0, 1.0), [(last[2] - first[2]) / span, 0.0].max, last[3] - first[3]]
    end
  end
end
