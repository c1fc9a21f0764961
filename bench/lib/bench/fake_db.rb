# frozen_string_literal: true

require "socket"

module Bench
  # A stand-in database for bench/run advice: a separate process listening on
  # a UNIX socket that answers each query after the delay the query names, so
  # that the app under test really waits on a socket (as it would for
  # PostgreSQL) without the server's CPU doing the waiting.
  #
  # Protocol, one line each way: the client sends "<microseconds>\n", the
  # server sleeps that long and answers "ok\n". A client may add its
  # CLOCK_MONOTONIC nanoseconds at the send ("<microseconds> <ns>\n"); with
  # FAKE_DB_LOG set, each such query is logged as "<ns sent> <ns answered>
  # <microseconds asked>": the remote's real time, the ground truth for the
  # I/O a window reads (bench/window_at). One thread per connection
  # (the app keeps one connection per thread, like a pool of size = threads);
  # a sleeping thread uses no CPU. The harness runs it pinned to the load
  # generator's CPU (BENCH_CLIENT_CPU), away from the server's.
  #
  #   ruby bench/lib/bench/fake_db.rb /tmp/fake.sock   # prints "ready" when listening
  class FakeDB
    MAX_DELAY_US = 10_000_000 # a query asking for more is answered at once with "error"

    def initialize(path, log: ENV["FAKE_DB_LOG"])
      @path = path
      @log = log && File.open(log, "a").tap { |f| f.sync = true }
      @log_lock = Mutex.new
    end

    def run
      File.unlink(@path) if File.socket?(@path)
      server = UNIXServer.new(@path)
      $stdout.puts "ready"
      $stdout.flush
      loop do
        conn = server.accept
        Thread.new(conn) { |c| serve(c) }
      end
    ensure
      File.unlink(@path) if @path && File.socket?(@path)
    end

    private

    def serve(conn)
      while (line = conn.gets)
        asked, sent = line.split(" ", 2)
        us = Integer(asked.to_s, exception: false)
        if us.nil? || us.negative? || us > MAX_DELAY_US
          conn.write("error\n")
          next
        end
        sleep(us / 1e6) if us.positive?
        conn.write("ok\n")
        note(sent, us)
      end
    rescue IOError, SystemCallError
      nil
    ensure
      conn.close unless conn.closed?
    end

    def note(sent, us)
      return unless @log && (ns = Integer(sent.to_s.strip, exception: false))

      line = "#{ns} #{Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)} #{us}\n"
      @log_lock.synchronize { @log.write(line) }
    end
  end
end

if $PROGRAM_NAME == __FILE__
  abort "usage: #{$PROGRAM_NAME} SOCKET_PATH" unless ARGV.size == 1
  trap("TERM") { exit }
  trap("INT") { exit }
  Bench::FakeDB.new(ARGV[0]).run
end
