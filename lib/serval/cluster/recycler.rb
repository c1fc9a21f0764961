# frozen_string_literal: true

require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # Which booted worker should be replaced, and why: worker_max_requests
    # (each worker's own limit drawn once in N..N*(1+jitter), so workers
    # started together do not all leave together), worker_max_memory (MB of
    # PSS, or RSS where smaps_rollup cannot be read; read by the master at
    # most once per check interval per worker) and a worker's own request
    # (replace_me, carried on its check-in). A plain object: the master
    # decides when (one worker at a time, Cluster#step_recycle).
    class Recycler
      # [megabytes, "PSS" or "RSS"] of a process, or nil when unreadable.
      def self.memory_mb(pid)
        rollup = File.read("/proc/#{pid}/smaps_rollup")
        kb = rollup[/^Pss:\s+(\d+) kB/, 1]
        return [kb.to_i / 1024.0, "PSS"] if kb

        rss_mb(pid)
      rescue SystemCallError, IOError
        rss_mb(pid)
      end

      def self.rss_mb(pid)
        kb = File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+) kB/, 1]
        kb && [kb.to_i / 1024.0, "RSS"]
      rescue SystemCallError, IOError
        nil
      end

      # memory: callable pid -> [mb, kind] or nil (tests feed their own)
      def initialize(max_requests:, jitter:, max_memory:, interval:, rng: Random.new, memory: Recycler.method(:memory_mb))
        @max_requests = max_requests
        @jitter = jitter
        @max_memory = max_memory
        @interval = interval
        @rng = rng
        @memory = memory
        @limits = {}   # pid => requests limit
        @measured = {} # pid => [at, [mb, kind]]
      end

      # The request limit of the worker with this pid (drawn once).
      def limit(pid)
        return nil unless @max_requests

        @limits[pid] ||= @max_requests + (@max_requests * @jitter * @rng.rand).floor
      end

      # Why the worker (pid, its last check-in status) should be replaced:
      # [:asked | :requests | :memory, a phrase for the log], or nil.
      # now: the monotonic clock, for the memory reading's interval.
      def reason(pid, status, now)
        asked = status[:recycle]
        return [:asked, "asked: #{asked}"] if asked.is_a?(String) && !asked.empty?

        count = status[:requests_count].to_i
        max = limit(pid)
        return [:requests, "#{count} requests >= #{max}"] if max && count >= max
        return nil unless @max_memory

        mb, kind = memory(pid, now)
        return nil unless mb && mb >= @max_memory

        [:memory, format("%<k>s %<m>d MB >= %<x>d MB", k: kind, m: mb, x: @max_memory)]
      end

      # The worker's last memory reading, [mb, kind] or nil.
      def memory(pid, now)
        at, value = @measured[pid]
        return value if at && now - at < @interval

        value = @memory.call(pid)
        @measured[pid] = [now, value]
        value
      end

      def forget(pid)
        @limits.delete(pid)
        @measured.delete(pid)
      end
    end
  end
end
