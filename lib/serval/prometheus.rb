# frozen_string_literal: true

module Serval
  # Renders launcher stats as Prometheus text exposition format 0.0.4.
  #
  #   Serval::Prometheus.render(launcher.stats)  # => "# HELP serval_backlog ...\n..."
  #
  # Known stats get their own name, type and help (STATS); any other numeric
  # stat becomes a gauge `serval_<key>`. In cluster mode every worker's
  # last_status is labelled {worker="INDEX",pid="PID"}. Entries under :timing
  # carry their own type and help (gauge, counter or histogram).
  module Prometheus
    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    # stat key => [metric name, type, help]
    STATS = {
      backlog: ["serval_backlog", :gauge, "Complete requests waiting for a thread"],
      running: ["serval_running_threads", :gauge, "Threads in the pool"],
      pool_capacity: ["serval_pool_capacity", :gauge, "Requests the pool can take now (idle plus not yet started threads)"],
      busy_threads: ["serval_busy_threads", :gauge, "Threads running a request"],
      max_threads: ["serval_max_threads", :gauge, "Configured maximum threads"],
      min_threads: ["serval_min_threads", :gauge, "Configured minimum threads"],
      requests_count: ["serval_requests_total", :counter, "Requests handed to the app"],
      connections: ["serval_connections", :gauge, "Open client connections"],
      accepted: ["serval_connections_accepted_total", :counter, "Connections accepted"],
      evicted: ["serval_connections_evicted_total", :counter, "Slowest connections closed to make room at max_connections"],
      rejected: ["serval_requests_rejected_total", :counter, "Requests answered with an error by the I/O core (4xx/5xx before the app)"],
      requests_shed: ["serval_requests_shed_total", :counter, "Requests answered 503 by load shedding (max_queue_time), also counted as rejected"],
      queue_wait_estimate: ["serval_queue_wait_estimate_seconds", :gauge, "Predicted wait for a thread of a request arriving now (with max_queue_time set)"],
      output_buffered_bytes: ["serval_output_buffered_bytes", :gauge, "Memory held by response output buffers (bounded by output_budget)"],
      output_spilled_bytes: ["serval_output_spilled_bytes", :gauge, "Response bytes in spill files in tmpdir (bounded by max_spill)"],
      output_spills: ["serval_output_spills_total", :counter, "Responses whose generated body spilled to a temp file"],
      output_waits: ["serval_output_waits_total", :counter, "Times a writer waited for its client: no output memory or spill left"],
      polled_rounds: ["serval_polled_rounds_total", :counter, "Rounds of the event loop run by request threads (thread polls)"],
      polled_waits: ["serval_polled_waits_total", :counter, "Of those, rounds a request thread with nothing to do waited on the epoll for"],
      request_timeouts: ["serval_request_timeouts_total", :counter, "Requests that ran past request_timeout"],
      stuck_threads: ["serval_stuck_threads", :gauge, "Request threads still running request_timeout_grace after their timeout"],
      workers: ["serval_workers", :gauge, "Configured workers"],
      booted_workers: ["serval_booted_workers", :gauge, "Workers booted and serving"],
      old_workers: ["serval_old_workers", :gauge, "Workers of an older phase still running"],
      phase: ["serval_phase", :gauge, "Current phase (incremented by each phased restart)"],
      workers_recycled: ["serval_workers_recycled_total", :counter, "Workers replaced by worker_max_requests, worker_max_memory or Serval.replace_worker"]
    }.freeze

    # stat key holding an Array of Hashes, one per named thing => [metric
    # prefix, label for its :name, {field => [type, help]}]. Fields not listed
    # become gauges "<prefix>_<field>"; an unknown list renders as
    # "serval_<key>_<field>{name="..."}".
    LISTS = {
      db_pools: ["serval_db_pool", :pool, {
        size: [:gauge, "Connections the Active Record pool may hold"],
        connections: [:gauge, "Connections the pool has opened"],
        busy: [:gauge, "Connections checked out by a thread"],
        idle: [:gauge, "Connections open and free"],
        waiting: [:gauge, "Threads waiting for a connection"],
        dead: [:gauge, "Connections held by threads that have died"]
      }]
    }.freeze

    # stat key holding a Hash => {field => [metric name, type, help]}; a
    # String field (`reason`) becomes the label of an info metric (value 1).
    GROUPS = {
      auto: {
        target_threads: ["serval_threads_target", :gauge, "Threads threads :auto has set (docs/tuning.md)"],
        min_threads: ["serval_threads_auto_min", :gauge, "The fewest threads auto may set"],
        max_threads: ["serval_threads_auto_max", :gauge, "The most threads auto may set"],
        changes: ["serval_threads_auto_changes_total", :counter, "Thread count changes made by auto"],
        model_threads: ["serval_threads_model_knee", :gauge, "The knee of the model auto last ran"],
        change_reason: ["serval_threads_auto_info", :gauge, "Why auto last changed the thread count (label reason)"]
      },
      io_lane: {
        max_io_threads: ["serval_max_io_threads", :gauge, "Most threads the I/O lane may add above max_threads"],
        idle_requests: ["serval_io_idle_requests", :gauge, "Requests in flight measured idle (the lane's signal)"],
        lane_threads: ["serval_io_lane_threads", :gauge, "Threads the I/O lane allows above max_threads now"],
        peak_lane_threads: ["serval_io_lane_threads_peak", :gauge, "Most threads the I/O lane has allowed at once"]
      }
    }.freeze

    # Per-worker figures taken from worker_status entries (not last_status).
    WORKER = {
      booted: ["serval_worker_booted", :gauge, "1 when the worker has booted"],
      phase: ["serval_worker_phase", :gauge, "Phase the worker was forked in"],
      last_checkin_age: ["serval_worker_last_checkin_age_seconds", :gauge, "Seconds since the worker last checked in"]
    }.freeze

    Family = Struct.new(:name, :type, :help, :samples)

    module_function

    # stats: the Hash of Launcher#stats (symbol keys). now: for checkin ages.
    def render(stats, process: process_stats, now: Time.now)
      families = {}
      add_stats(families, stats, {})
      Array(stats[:worker_status]).each do |w|
        labels = { worker: w[:index], pid: w[:pid] }
        add_worker(families, w, labels, now)
        add_stats(families, w[:last_status] || {}, labels)
      end
      process.each { |name, (type, help, value)| add(families, name, type, help, {}, value) }
      started = parse_time(stats[:started_at])
      add(families, "process_start_time_seconds", :gauge, "Start time of the server since the Unix epoch in seconds",
          {}, started.to_f.round(3)) if started
      families.each_value.map { |f| format_family(f) }.join
    end

    def add_stats(families, stats, labels)
      stats.each do |key, value|
        next if key == :timing || key == :worker_status
        next add_group(families, key, value, labels) if GROUPS.key?(key) && value.is_a?(Hash)
        next add_list(families, key, value, labels) if value.is_a?(Array)
        next unless value.is_a?(Numeric)

        name, type, help = STATS[key] || ["serval_#{sanitize(key)}", :gauge, "Serval stat #{key}"]
        add(families, name, type, help, labels, value)
      end
      (stats[:timing] || {}).each { |key, entry| add_timing(families, key, entry, labels) }
    end

    def add_list(families, key, entries, labels)
      prefix, label, fields = LISTS[key] || ["serval_#{sanitize(key)}", :name, {}]
      entries.each do |entry|
        next unless entry.is_a?(Hash) && entry.key?(:name)

        entry_labels = labels.merge(label => entry[:name])
        entry.each do |field, value|
          next if field == :name || !value.is_a?(Numeric)

          type, help = fields[field] || [:gauge, "Serval stat #{key} #{field}"]
          add(families, "#{prefix}_#{sanitize(field)}", type, help, entry_labels, value)
        end
      end
    end

    def add_group(families, key, hash, labels)
      GROUPS[key].each do |field, (name, type, help)|
        value = hash[field]
        if value.is_a?(String)
          add(families, name, type, help, labels.merge(reason: value), 1)
        elsif value.is_a?(Numeric)
          add(families, name, type, help, labels, value)
        end
      end
    end

    def add_worker(families, worker, labels, now)
      name, type, help = WORKER[:booted]
      add(families, name, type, help, labels, worker[:booted] ? 1 : 0)
      name, type, help = WORKER[:phase]
      add(families, name, type, help, labels, worker[:phase]) if worker[:phase].is_a?(Numeric)
      checkin = parse_time(worker[:last_checkin])
      return unless checkin

      name, type, help = WORKER[:last_checkin_age]
      add(families, name, type, help, labels, [now - checkin, 0].max.round(3))
    end

    def add_timing(families, key, entry, labels)
      type = entry[:type].to_sym
      name = sanitize(key)
      name = "serval_#{name}" unless name.start_with?("serval_")
      name = "#{name}_total" if type == :counter && !name.end_with?("_total")
      help = entry[:help] || "Serval timing #{key}"
      value = type == :histogram ? entry : entry[:value]
      return if value.nil?

      add(families, name, type, help, labels, value)
    end

    def add(families, name, type, help, labels, value)
      family = (families[name] ||= Family.new(name, type, help, []))
      family.samples << [labels, value]
    end

    def format_family(family)
      out = +"# HELP #{family.name} #{escape_help(family.help)}\n# TYPE #{family.name} #{family.type}\n"
      family.samples.each do |labels, value|
        if family.type == :histogram
          out << histogram_lines(family.name, labels, value)
        else
          out << sample(family.name, labels, value)
        end
      end
      out
    end

    def histogram_lines(name, labels, hist)
      out = +""
      # from a worker's JSON check-in the +Inf bound arrives as nil or "+Inf"
      buckets = hist[:buckets].to_a.map { |le, n| [le.is_a?(Numeric) ? le : Float::INFINITY, n] }
      buckets += [[Float::INFINITY, hist[:count]]] unless buckets.last&.first == Float::INFINITY
      buckets.each do |le, count|
        out << sample("#{name}_bucket", labels.merge(le: number(le)), count)
      end
      out << sample("#{name}_sum", labels, hist[:sum] || 0)
      out << sample("#{name}_count", labels, hist[:count] || buckets.last.last)
    end

    def sample(name, labels, value)
      return "#{name} #{number(value)}\n" if labels.empty?

      pairs = labels.map { |k, v| %(#{k}="#{escape_label(v)}") }.join(",")
      "#{name}{#{pairs}} #{number(value)}\n"
    end

    def number(value)
      return value.to_s if value.is_a?(Integer)

      value = value.to_f
      return "NaN" if value.nan?
      return value.positive? ? "+Inf" : "-Inf" if value.infinite?

      value == value.floor && value.abs < 1e15 ? value.to_i.to_s : value.to_s
    end

    def sanitize(key)
      key.to_s.gsub(/[^a-zA-Z0-9_]/, "_").sub(/\A(?=\d)/, "_")
    end

    def escape_label(value)
      value.to_s.gsub("\\", "\\\\\\\\").gsub("\n", "\\n").gsub('"', '\\"')
    end

    def escape_help(text)
      text.to_s.gsub("\\", "\\\\\\\\").gsub("\n", "\\n")
    end

    def parse_time(value)
      case value
      when Time then value
      when String
        require "time"
        Time.iso8601(value)
      end
    rescue ArgumentError
      nil
    end

    # Figures of this process (the master in cluster mode): name => [type, help, value].
    def process_stats
      gc = GC.stat
      out = {
        "process_cpu_seconds_total" => [:counter, "User and system CPU time of this process in seconds",
                                        Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID).round(6)],
        "ruby_gc_runs_total" => [:counter, "Garbage collections in this process", gc[:count]],
        "ruby_heap_live_slots" => [:gauge, "Live object slots in this process's heap", gc[:heap_live_slots]]
      }
      rss = resident_bytes
      out["process_resident_memory_bytes"] = [:gauge, "Resident memory of this process in bytes", rss] if rss
      fds = open_fds
      out["process_open_fds"] = [:gauge, "Open file descriptors of this process", fds] if fds
      out
    end

    def resident_bytes
      require "etc"
      File.read("/proc/self/statm").split[1].to_i * Etc.sysconf(Etc::SC_PAGESIZE)
    rescue SystemCallError
      nil
    end

    def open_fds
      Dir.children("/proc/self/fd").size
    rescue SystemCallError
      nil
    end
  end
end
