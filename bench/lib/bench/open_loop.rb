# frozen_string_literal: true

require "socket"
require "json"
require "optparse"

module Bench
  # An open-loop HTTP load generator (wrk is closed-loop): requests are sent
  # at Poisson arrival times fixed in advance, whatever the server does, and
  # each latency is measured from the request's scheduled time, not from when
  # a connection was free to send it - so a server that falls behind is
  # charged for the whole wait (no coordinated omission).
  #
  # `connections` threads each keep one keep-alive connection and take the
  # next scheduled request in order; more connections than requests in
  # flight keep the schedule. Requests scheduled in the first `warmup`
  # seconds are sent but not counted.
  #
  #   ruby bench/lib/bench/open_loop.rb --url http://127.0.0.1:9292/work --rate 50 \
  #        --duration 20 [--warmup 2] [--connections 64] [--seed 1] [--tag] [--latencies] [--series FILE]
  # prints one JSON object: rate, sent, completed, errors, late (sent more
  # than 10 ms after their time), p50_ms, p90_ms, p99_ms, max_ms, achieved_rps;
  # with --latencies also latencies_ms, every counted 200's latency (sorted),
  # so that several runs' samples can be pooled into one percentile.
  # Latencies and `completed` are those of 200 responses. A 503 (a server
  # shedding load) is not an error: it is counted in `shed`, with its own
  # shed_p50_ms, shed_p99_ms and shed_max_ms, and the connection is opened
  # anew after it when the server closes it. goodput_rps: 200s a second over
  # the span from the end of the warm-up to the last counted answer (a server
  # that falls behind answers the schedule's tail after `duration`, and
  # achieved_rps, counted over `duration`, would overstate it).
  #
  # --tag adds `r=N` to every request's query (N = seed x 10^7 + the
  # request's place in the schedule): an app that draws a request's work from
  # N (bench/apps/advice.ru) gives every server and thread count the same
  # requests in the same order, so that runs with one seed differ only by the
  # server (common random numbers) and not by which requests drew long.
  #
  # --mix "PATH@WEIGHT,PATH@WEIGHT,..." sends each request to one of the
  # paths (the URL's path is then unused), drawn by weight from a sequence
  # seeded with the seed: one seed, the same paths in the same order.
  class OpenLoop
    TAG_BASE = 10_000_000
    def initialize(host:, port:, path:, rate:, duration:, warmup: 2.0, connections: 64, seed: 1, timeout: 30.0,
                   latencies: false, tag: false, mix: nil, series: nil)
      raise ArgumentError, "rate must be > 0" unless rate.positive?

      @tag = tag && (seed * TAG_BASE)

      @host = host
      @port = port
      @path = path
      @duration = duration
      @warmup = warmup
      @connections = connections
      @timeout = timeout
      @keep = latencies
      @series = series
      rng = Random.new(seed)
      t = 0.0
      @schedule = []
      loop do
        t += -Math.log(1.0 - rng.rand) / rate
        break if t > warmup + duration

        @schedule << t
      end
      @paths = mix && OpenLoop.draw_paths(mix, @schedule.size, Random.new(seed + 7919))
      @rate = rate
      @next = 0
      @lock = Mutex.new
    end

    def run
      start = now + 0.2
      results = Array.new(@connections) { Thread.new { worker(start) } }.map(&:value)
      lat = []
      shed = []
      errors = 0
      late = 0
      last = start + @warmup
      results.each do |r|
        last = r[:last] if r[:last] > last
        lat.concat(r[:latencies])
        shed.concat(r[:shed])
        errors += r[:errors]
        late += r[:late]
      end
      lat.sort!
      shed.sort!
      counted = @schedule.count { |s| s >= @warmup }
      out = { rate: @rate, duration: @duration, connections: @connections, sent: @schedule.size, counted: counted,
        completed: lat.size, errors: errors, late: late, achieved_rps: (lat.size / @duration).round(2),
        p50_ms: ms(q(lat, 0.5)), p90_ms: ms(q(lat, 0.9)), p99_ms: ms(q(lat, 0.99)), max_ms: ms(lat.last),
        shed: shed.size, shed_p50_ms: ms(q(shed, 0.5)), shed_p99_ms: ms(q(shed, 0.99)), shed_max_ms: ms(shed.last),
        elapsed: (last - start - @warmup).round(3),
        goodput_rps: (lat.size / [last - start - @warmup, @duration].max).round(2) }
      out[:latencies_ms] = lat.map { |l| (l * 1e3).round(2) } if @keep
      write_series(results, start) if @series
      out
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # --series FILE: one line per counted request, in schedule order: its
    # scheduled time (Unix seconds), its latency in ms and its status (0:
    # none), to see when in a run the slow requests came.
    def write_series(results, start)
      epoch = Process.clock_gettime(Process::CLOCK_REALTIME) - now + start
      rows = results.flat_map { |r| r[:series] }.sort_by(&:first)
      File.write(@series, rows.map { |at, l, st| format("%.3f %.2f %d\n", epoch + at, l * 1e3, st.to_i) }.join)
    end

    # "PATH@W,PATH@W" -> one path per scheduled request, drawn by weight.
    def self.draw_paths(spec, count, rng)
      routes = spec.split(",").map do |part|
        path, weight = part.split(/@(?=[\d.]+\z)/, 2)
        raise ArgumentError, "--mix: #{part.inspect} is not PATH@WEIGHT" unless path&.start_with?("/") && weight

        [path, Float(weight)]
      end
      total = routes.sum(&:last)
      raise ArgumentError, "--mix: the weights sum to 0" unless total.positive?

      Array.new(count) do
        u = rng.rand * total
        routes.find { |_, w| (u -= w).negative? }&.first || routes.last.first
      end
    end

    def take
      @lock.synchronize do
        i = @next
        @next += 1
        i < @schedule.size ? [@schedule[i], i] : nil
      end
    end

    def worker(start)
      out = { latencies: [], shed: [], errors: 0, late: 0, last: 0.0, series: [] }
      sock = nil
      while (slot = take)
        at, index = slot
        due = start + at
        wait = due - now
        sleep(wait) if wait.positive?
        out[:late] += 1 if now - due > 0.010 && at >= @warmup
        begin
          sock ||= TCPSocket.new(@host, @port).tap { |s| s.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) }
          status, close = request(sock, index)
        rescue IOError, SystemCallError
          status = nil
        end
        if close || status != 200
          sock&.close
          sock = nil
        end
        next if at < @warmup

        out[:last] = now
        out[:series] << [at, now - due, status] if @series
        case status
        when 200 then out[:latencies] << (now - due)
        when 503 then out[:shed] << (now - due)
        else out[:errors] += 1
        end
      end
      out
    ensure
      sock&.close
    end

    # One GET on a keep-alive connection. Returns [status, close]: the status
    # code of a complete response (nil for none) and whether the server
    # closes the connection after it.
    def request(sock, index)
      base = @paths ? @paths[index] : @path
      path = @tag ? "#{base}#{base.include?('?') ? '&' : '?'}r=#{@tag + index}" : base
      sock.write("GET #{path} HTTP/1.1\r\nHost: #{@host}:#{@port}\r\n\r\n")
      status = read_line(sock) or return [nil, true]
      length = nil
      close = false
      while (line = read_line(sock)) && !line.empty?
        name, value = line.split(":", 2)
        name = name.downcase
        length = Integer(value) if name == "content-length"
        close = true if name == "connection" && value.strip.casecmp?("close")
      end
      return [nil, true] unless line && length && sock.read(length)&.bytesize == length

      [status[%r{\AHTTP/1\.[01] (\d{3})}, 1]&.to_i, close]
    end

    def read_line(sock)
      return nil unless sock.wait_readable(@timeout)

      sock.gets("\r\n")&.chomp("\r\n")
    end

    def q(sorted, p) = sorted.empty? ? nil : sorted[[(p * sorted.size).ceil - 1, 0].max]
    def ms(sec) = sec && (sec * 1e3).round(3)
  end
end

if $PROGRAM_NAME == __FILE__
  o = { warmup: 2.0, connections: 64, seed: 1 }
  OptionParser.new do |op|
    op.on("--url URL") { |v| o[:url] = v }
    op.on("--rate R", Float) { |v| o[:rate] = v }
    op.on("--duration S", Float) { |v| o[:duration] = v }
    op.on("--warmup S", Float) { |v| o[:warmup] = v }
    op.on("--connections N", Integer) { |v| o[:connections] = v }
    op.on("--seed N", Integer) { |v| o[:seed] = v }
    op.on("--latencies") { o[:latencies] = true }
    op.on("--tag") { o[:tag] = true }
    op.on("--mix SPEC") { |v| o[:mix] = v }
    op.on("--series FILE") { |v| o[:series] = v }
  end.parse!
  abort "usage: open_loop.rb --url URL --rate R --duration S" unless o[:url] && o[:rate] && o[:duration]
  m = o[:url].match(%r{\Ahttp://([^:/]+):(\d+)(/.*)?\z}) or abort "open_loop.rb: --url must be http://HOST:PORT/PATH"
  lg = Bench::OpenLoop.new(host: m[1], port: Integer(m[2]), path: m[3] || "/", rate: o[:rate], duration: o[:duration],
                           warmup: o[:warmup], connections: o[:connections], seed: o[:seed],
                           latencies: o.fetch(:latencies, false), tag: o.fetch(:tag, false), mix: o[:mix], series: o[:series])
  puts JSON.generate(lg.run)
end
