# frozen_string_literal: true

require "socket"
require "io/wait"

module Serval
  # Continuous HTTP load for the zero-drop tests and the restarts bench:
  # `threads` clients, each sending GET requests on keep-alive connections of
  # 1..max_per_conn requests, then opening a new one. Counting rules
  # (bench/NOTES.md, "Zero dropped requests"):
  #   ok       a complete 200 response
  #   failed   anything else: an error status, a truncated response, a reset or
  #            EOF on a new connection after the request was written, a timeout
  #   retried  a request sent on a *reused* keep-alive connection that the
  #            server closed before sending one byte of the answer: sent again
  #            once on a new connection, as HTTP clients do for idempotent
  #            requests (RFC 9112, 9.3.1); the retry's outcome is what counts
  #   refused  connect() refused or reset before the request after #refuse_from
  #            was called (graceful stop: the server no longer listens)
  class LoadClient
    Result = Struct.new(:ok, :failed, :retried, :refused, :errors, keyword_init: true)

    def initialize(port, threads: 4, max_per_conn: 5, path: "/", timeout: 10)
      @port = port
      @threads = threads
      @max_per_conn = max_per_conn
      @path = path
      @timeout = timeout
      @mutex = Mutex.new
      @counts = Hash.new(0)
      @errors = []
      @stop = false
      @refusing = false
    end

    def start
      @workers = Array.new(@threads) { |i| Thread.new { run_client(i) } }
      self
    end

    def refuse_from_now
      @refusing = true
    end

    def ok_count
      @mutex.synchronize { @counts[:ok] }
    end

    # Blocks until at least n more requests succeeded (bounded by timeout).
    def wait_for_more(n, timeout: 10)
      target = ok_count + n
      deadline = now + timeout
      sleep 0.01 while ok_count < target && now < deadline
      ok_count >= target
    end

    def stop
      @stop = true
      @workers.each { |t| t.join(@timeout + 5) }
      @mutex.synchronize do
        Result.new(ok: @counts[:ok], failed: @counts[:failed], retried: @counts[:retried],
                   refused: @counts[:refused], errors: @errors.first(10))
      end
    end

    private

    def count(key, error = nil)
      @mutex.synchronize do
        @counts[key] += 1
        @errors << error if error
      end
    end

    def run_client(id)
      until @stop
        sock = connect
        next unless sock

        begin
          rand(1..@max_per_conn).times do |n|
            break if @stop

            outcome = exchange(sock)
            if outcome == :ok || outcome == :ok_close
              count(:ok)
              break if outcome == :ok_close
            elsif outcome == :closed_before_answer && n.positive?
              count(:retried)
              retry_once(id)
              break
            else
              record_failure(outcome, id)
              break
            end
          end
        ensure
          sock.close unless sock.closed?
        end
      end
    end

    def retry_once(id)
      sock = connect
      return unless sock

      outcome = exchange(sock)
      outcome == :ok || outcome == :ok_close ? count(:ok) : record_failure(outcome, id)
    ensure
      sock&.close
    end

    def record_failure(outcome, id)
      if @refusing && outcome == :closed_before_answer
        count(:refused)
      else
        count(:failed, "client #{id}: #{outcome}")
      end
    end

    def connect
      TCPSocket.new("127.0.0.1", @port)
    rescue SystemCallError => e
      if @refusing
        count(:refused)
        sleep 0.005
      else
        count(:failed, "connect: #{e.class}")
        sleep 0.01
      end
      nil
    end

    # :ok, :ok_close, :closed_before_answer, or a failure description.
    def exchange(sock)
      sock.write("GET #{@path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
      read_response(sock)
    rescue Errno::EPIPE, Errno::ECONNRESET
      :closed_before_answer
    end

    def read_response(sock)
      buf = +"".b
      deadline = now + @timeout
      until (head_end = buf.index("\r\n\r\n"))
        chunk = read_some(sock, deadline)
        return(buf.empty? ? :closed_before_answer : "truncated head") if chunk == :eof
        return "timeout" if chunk == :timeout

        buf << chunk
      end
      head = buf[0, head_end]
      status = head[/\AHTTP\/1\.1 (\d{3})/, 1]
      length = head[/^content-length:\s*(\d+)/i, 1].to_i
      body = buf[(head_end + 4)..]
      while body.bytesize < length
        chunk = read_some(sock, deadline)
        return "truncated body" if chunk == :eof || chunk == :timeout

        body << chunk
      end
      return "status #{status}" unless status == "200"

      head.match?(/^connection:\s*close/i) ? :ok_close : :ok
    rescue Errno::ECONNRESET
      buf.empty? ? :closed_before_answer : "reset mid-response"
    end

    def read_some(sock, deadline)
      left = deadline - now
      return :timeout if left <= 0 || !sock.wait_readable(left)

      chunk = sock.read_nonblock(65_536, exception: false)
      return :eof if chunk.nil?

      chunk == :wait_readable ? "".b : chunk
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
