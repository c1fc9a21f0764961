# frozen_string_literal: true

require "serval/commands"

require "json"
require "optparse"
require "socket"
require "uri"
require "serval/version"
require "serval/errors"

module Serval
  # `servalctl`: talks to a running server's control app (docs/control.md).
  #
  #   servalctl -C unix:///run/app/ctl.sock -T T stats   # --control-url, --control-token
  #   servalctl -S tmp/serval.state stop
  #   servalctl -F config/serval.rb gvl-trace --seconds 2 -o trace.json
  #   servalctl status            # $SERVAL_CONTROL_URL, ./tmp/serval.state, config/*.rb
  #
  # It never runs a config file (one may boot the app): Serval::ConfigScan
  # reads the literal arguments of control_url / activate_control_app /
  # state_path from it, and only when nothing before it named the server.
  #
  # Exit status: 0 done, 1 the server answered with an error, 2 usage or
  # configuration error, 3 the server could not be reached (refused, no
  # socket, no answer in time: down), 4 busy: the server is up but its
  # advice was still computing when `advise --wait` ran out.
  class Ctl
    COMMANDS = Commands::CTL
    ENV_URL = "SERVAL_CONTROL_URL"
    ENV_TOKEN = "SERVAL_CONTROL_TOKEN"
    DEFAULT_STATE = "tmp/serval.state" # StateFile::DEFAULT, the server's default
    WINDOW_FIGURES = %w[queue run idle stall lock pool_wait wall].freeze
    CONNECT_TIMEOUT = 5
    READ_TIMEOUT = 15

    EXIT_BUSY = 4
    ADVISE_WAIT = 60.0 # advise: seconds to keep asking a busy server (--wait)
    SERVER_WAIT = 10.0 # the longest one /advice request waits there (ControlApp::ADVICE_WAIT)

    class Unreachable < StandardError; end

    def initialize(argv, stdout: $stdout, stderr: $stderr, env: ENV)
      @argv = argv.dup
      @env = env
      @stdout = stdout
      @stderr = stderr
      @url = nil
      @token = nil
      @state = nil
      @config = nil
      @seconds = nil
      @output = nil
      @json = false
      @advise = { fleet: {}, wait: ADVISE_WAIT }
      @with_window = false
    end

    def run
      command = parse
      return 0 if command == :done
      return advise if command == "advise"

      resolve_target
      status, body = request(path_for(command))
      return report_error(command, status, body) unless status == 200

      return save_trace(body) if command == "gvl-trace"
      return stats_with_window(body) if command == "stats" && @with_window

      show(command, JSON.parse(body))
      0
    rescue OptionParser::ParseError, ConfigError => e
      @stderr.puts("servalctl: #{e.message}")
      2
    rescue Unreachable => e
      @stderr.puts("servalctl: cannot reach the server at #{@url}: #{e.message}")
      3
    end

    private

    def parse
      rest = parser.parse(@argv)
      return :done if @done
      raise OptionParser::InvalidArgument, "give one command: #{COMMANDS.join(' ')}" unless rest.size == 1
      raise OptionParser::InvalidArgument, "unknown command #{rest.first}" unless COMMANDS.include?(rest.first)

      rest.first
    end

    def parser
      OptionParser.new do |o|
        o.banner = "Usage: servalctl [options] #{COMMANDS.join('|')}"
        o.on("-C", "--control-url URL", "unix://PATH or tcp://HOST:PORT (as pumactl's -C)") { |v| control_url_flag(v) }
        o.on("-T", "--control-token TOKEN", "The control app's token") { |v| @token = v }
        o.on("-S", "--state PATH", "Read the URL and token from a state file") { |v| @state = v }
        o.on("-F", "--config-file FILE", "--config FILE",
             "Read control_url, token and state_path from a config file (never run)") { |v| @config = v }
        o.on("--seconds N", Float, "gvl-trace: how long to record (default 1)") { |v| @seconds = v }
        o.on("--json", "window: print the window as JSON (with its samples)") { @json = true }
        o.on("-o", "--output FILE", "gvl-trace: write the trace to FILE (default: stdout)") { |v| @output = v }
        o.on("--window", "stats: include the measurement window (for advise --from)") { @with_window = true }
        require "serval/ctl_advise"
        CtlAdvise.options(o, @advise)
        o.on("-V", "--version", "Print the version") { done(@stdout.puts("servalctl #{VERSION}")) }
        o.on("-h", "--help", "Show this help") { done(@stdout.puts(o.help)) }
      end
    end

    def done(_)
      @done = true
    end

    # -C was the config file before it became pumactl's control URL: a value
    # that is not a URL is still read as one, with a note.
    def control_url_flag(value)
      return @url = value if value.match?(%r{\A[a-z]+://}) || value.empty?

      @stderr.puts("servalctl: -C is the control URL (as in pumactl); reading #{value} as a config file: use -F")
      @config = value
    end

    # Where the URL and token come from, first match wins for each:
    #   1. flags: --control-url/--control-token, then -S STATE, then -F CONFIG
    #   2. SERVAL_CONTROL_URL / SERVAL_CONTROL_TOKEN
    #   3. ./tmp/serval.state (what a server with a control app writes)
    #   4. the default config file, scanned (never run): its state_path's
    #      file, then its control_url / activate_control_app
    def resolve_target
      @unreadable = []
      [-> { from_state(@state, explicit: true) if @state },
       -> { from_config(@config) if @config && @config != "-" },
       -> { fill(@env[ENV_URL], @env[ENV_TOKEN]) },
       -> { from_state(DEFAULT_STATE, explicit: false) },
       -> { (file = default_config) && from_config(file) unless @config }].each do |source|
        break if @url && @token

        source.call
      end
      raise ConfigError, missing("URL", :control_url) unless @url
      raise ConfigError, missing("token", :control_auth_token) unless @token
    end

    def fill(url, token)
      @url ||= url unless url.to_s.empty?
      @token ||= token unless token.to_s.empty?
    end

    # explicit (-S, a config's state_path): a missing file is an error;
    # the default ./tmp/serval.state is only looked for.
    def from_state(path, explicit:)
      return unless explicit || File.exist?(path)

      require "serval/state_file"
      state = StateFile.new(path).read
      fill(state["control_url"], state["control_auth_token"])
    end

    def from_config(path)
      require "serval/config_scan"
      scan = ConfigScan.new(path)
      state = scan.values[:state_path]
      from_state(state, explicit: !scan.values.key?(:control_url)) if state && (File.exist?(state) || !@url)
      fill(scan.values[:control_url], scan.values[:control_auth_token])
      scan.unreadable.each { |key, why| @unreadable << [key, "#{path}: #{why}"] }
    rescue SystemCallError => e
      raise ConfigError, "config file #{path}: #{e.message}"
    end

    # The first of the server's default config files that exists (the
    # environment as the server reads it: APP_ENV, RACK_ENV, RAILS_ENV).
    def default_config
      require "serval/configuration"
      environment = %w[APP_ENV RACK_ENV RAILS_ENV].map { |n| @env[n].to_s.strip }.find { |v| !v.empty? } ||
                    Configuration::DEFAULTS[:environment]
      Configuration.default_files(environment).find { |f| File.file?(f) }
    end

    def missing(what, key)
      why = @unreadable.find { |k, _| k == key || k == :state_path }
      return "#{why[1]}: cannot read without running the file: pass -S or -C" if why

      if what == "URL"
        "no control URL: give -C URL (--control-url), -S STATE, $#{ENV_URL}, " \
          "or start the server with a control app (it writes #{DEFAULT_STATE})"
      else
        "no control token for #{@url}: give -T TOKEN (--control-token), $#{ENV_TOKEN} or -S STATE"
      end
    end

    def path_for(command)
      query = URI.encode_www_form({ token: @token, seconds: (@seconds if command == "gvl-trace") }.compact)
      "/#{command == 'status' ? 'stats' : command}?#{query}"
    end

    # One GET over a fresh connection; returns [status, body, head].
    def request(path)
      socket = connect
      socket.write("GET #{path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
      response = read_all(socket, READ_TIMEOUT + @seconds.to_f)
      head, body = response.split("\r\n\r\n", 2)
      status = head.to_s[%r{\AHTTP/1\.[01] (\d{3})}, 1]
      raise Unreachable, "no HTTP response" unless status

      [status.to_i, body.to_s, head.to_s]
    ensure
      socket&.close
    end

    def connect
      case @url
      when %r{\Aunix://(.+)\z} then UNIXSocket.new(Regexp.last_match(1))
      when %r{\Atcp://\[?([^\]]+?)\]?:(\d+)\z}
        Socket.tcp(Regexp.last_match(1), Regexp.last_match(2).to_i, connect_timeout: CONNECT_TIMEOUT)
      else raise ConfigError, "control URL #{@url}: expected unix://PATH or tcp://HOST:PORT"
      end
    rescue SystemCallError, SocketError => e
      raise Unreachable, e.message
    end

    def read_all(socket, timeout)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      out = +""
      loop do
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise Unreachable, "no answer within #{timeout.round}s" if left <= 0 || !socket.wait_readable(left)

        chunk = socket.read_nonblock(65_536, exception: false)
        return out if chunk.nil?

        out << chunk unless chunk == :wait_readable
      end
    rescue SystemCallError => e
      raise Unreachable, e.message
    end

    # advise: from --from FILE here, else the server's /advice.
    def advise
      cmd = CtlAdvise.new(@advise, stdout: @stdout, stderr: @stderr)
      cmd.validate!
      return cmd.show(*cmd.from_file) if @advise[:from]

      resolve_target
      status, body = ask_advice(cmd)
      return status if status == EXIT_BUSY
      return report_error("advise", status, body) unless status == 200

      window = nil
      if @advise[:html]
        wstatus, wbody = request("/window?#{URI.encode_www_form(token: @token)}")
        window = JSON.parse(wbody) if wstatus == 200
      end
      cmd.show(JSON.parse(body), window)
    rescue CtlAdvise::NoWindow => e
      @stderr.puts("servalctl: advise: #{e.message}")
      1
    end

    # /advice answers 503 busy (Retry-After) while its model computes: ask
    # again until --wait runs out; then say so and return EXIT_BUSY.
    def ask_advice(cmd)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @advise[:wait]
      loop do
        wait = (deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)).clamp(0, SERVER_WAIT)
        query = cmd.query.merge("token" => @token, "wait" => format("%.2f", wait))
        status, body, head = request("/advice?#{URI.encode_www_form(query)}")
        return [status, body] unless status == 503 && busy?(body)

        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        if left <= 0
          @stderr.puts("servalctl: advise: the server is up but still computing its advice " \
                       "(#{@advise[:wait].round(1)} s waited); try again, or give --wait more")
          return [EXIT_BUSY, body]
        end
        retry_after = head[/^retry-after:\s*(\d+)/i, 1]&.to_f || 1.0
        sleep([[retry_after, 0.05].max, left].min)
      end
    end

    def busy?(body)
      JSON.parse(body)["busy"] == true
    rescue JSON::ParserError
      false
    end

    # stats --window: the snapshot with the window under "window", so that
    # `advise --from` works on it.
    def stats_with_window(body)
      stats = JSON.parse(body)
      status, wbody = request("/window?#{URI.encode_www_form(token: @token)}")
      if status == 200
        stats["window"] = JSON.parse(wbody)
      else
        @stderr.puts("servalctl: stats --window: the server has no measurement window (#{status}); stats only")
      end
      @stdout.puts(JSON.pretty_generate(stats))
      status == 200 ? 0 : 1
    end

    def report_error(command, status, body)
      message = (JSON.parse(body)["error"] rescue body)
      @stderr.puts("servalctl: #{command} failed: #{status} #{message}")
      1
    end

    def show(command, data)
      case command
      when "status" then @stdout.puts(status_line(data))
      when "thread-backtraces" then show_backtraces(data)
      when "stats", "gc-stats" then @stdout.puts(JSON.pretty_generate(data))
      when "window" then @json ? @stdout.puts(JSON.generate(data)) : show_window(data)
      else @stdout.puts("#{command}: sent")
      end
    end

    # The trace as the server sent it (Chrome trace-event JSON, one object):
    # to stdout, or to --output with a summary line.
    def save_trace(body)
      unless @output
        @stdout.puts(body)
        return 0
      end

      File.write(@output, body)
      trace = JSON.parse(body)
      missing = Array(trace.dig("otherData", "missing"))
      @stdout.puts("gvl-trace: wrote #{@output} (#{Array(trace['traceEvents']).size} events" \
                   "#{", no answer from #{missing.map { |m| "worker #{m['index']}" }.join(', ')}" if missing.any?})")
      0
    rescue SystemCallError => e
      @stderr.puts("servalctl: gvl-trace: cannot write #{@output} (#{e.message})")
      1
    end

    # The window's figures in ms: mean (from the histogram sums, every
    # request) and p50 / p95 / p99 of the sampled requests.
    def show_window(data)
      samples = Array(data["samples"])
      @stdout.puts(format("window: %<r>d requests in %<s>.1f s, %<p>s process(es), %<n>d sampled, gvl split %<g>s",
                          r: data["requests"].to_i, s: data["seconds"].to_f, p: data["processes"] || 1,
                          n: samples.size, g: data["gvl_split"] ? "yes" : "no (Ruby < 3.2: run = CPU)"))
      @stdout.puts(format("%-10s %10s %10s %10s %10s", "figure", "mean ms", "p50 ms", "p95 ms", "p99 ms"))
      WINDOW_FIGURES.each do |f|
        hist = data.dig("histograms", f)
        values = samples.filter_map { |x| x[f] }.sort
        next unless hist || values.any?

        mean = hist && hist["counts"].sum.positive? ? hist["sum"].to_f / hist["counts"].sum : nil
        cells = [mean, *[0.5, 0.95, 0.99].map { |q| values.empty? ? nil : values[((values.size - 1) * q).round] }]
        @stdout.puts(format("%-10s %10s %10s %10s %10s", f, *cells.map { |v| v ? format("%.2f", v * 1e3) : "-" }))
      end
      @stdout.puts("io waits per request: #{data['io_waits']}") if data["io_waits"]
      Array(data["missing"]).each { |m| @stdout.puts("worker #{m['index']} (pid #{m['pid']}): no answer (#{m['error']})") }
    end

    def status_line(stats)
      if stats["worker_status"]
        "serval is running (cluster, phase #{stats['phase']}): #{stats['booted_workers']}/#{stats['workers']} " \
          "workers booted, started #{stats['started_at']}"
      else
        "serval is running (single): #{stats['busy_threads']}/#{stats['max_threads']} threads busy, " \
          "backlog #{stats['backlog']}, #{stats['requests_count']} requests, started #{stats['started_at']}"
      end
    end

    # Single mode: {thread => frames}; cluster: the master's and each worker's.
    def show_backtraces(data)
      return print_threads(data, "") unless data["workers"].is_a?(Array)

      @stdout.puts("master (pid #{data.dig('master', 'pid')}):")
      print_threads(data.dig("master", "threads") || {}, "  ")
      data["workers"].each do |w|
        @stdout.puts("worker #{w['index']} (pid #{w['pid']}):")
        print_threads(w["threads"] || {}, "  ")
      end
      Array(data["missing"]).each { |m| @stdout.puts("worker #{m['index']} (pid #{m['pid']}): no answer (#{m['error']})") }
    end

    def print_threads(threads, indent)
      threads.each do |name, frames|
        @stdout.puts("#{indent}#{name}:")
        Array(frames).each { |frame| @stdout.puts("#{indent}    #{frame}") }
      end
    end
  end
end
