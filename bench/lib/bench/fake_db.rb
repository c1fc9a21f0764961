# frozen_string_literal: true

require "socket"

module Bench
  # A stand-in database for bench/run advice: a separate process listening on
  # a UNIX socket that answers each query after the delay the query names, so
  # that the app under test really waits on a socket (as it would for
  # PostgreSQL) without the server's CPU doing the waiting.
  #
  # Protocol, one line each way: the client sends "<microseconds>\n", the
  # server sleeps that long and answers "ok\n". One thread per connection
  # (the app keeps one connection per thread, like a pool of size = threads);
  # a sleeping thread uses no CPU. The harness runs it pinned to the load
  # generator's CPU (BENCH_CLIENT_CPU), away from the server's.
  #
  #   ruby bench/lib/bench/fake_db.rb /tmp/fake.sock   # prints "ready" when listening
  class FakeDB
    MAX_DELAY_US = 10_000_000 # a query asking for more is answered at once with "error"

    def initialize(path)
      @path = path
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
        us = Integer(line.strip, exception: false)
        if us.nil? || us.negative? || us > MAX_DELAY_US
          conn.write("error\n")
          next
        end
        sleep(us / 1e6) if us.positive?
        conn.write("ok\n")
      end
    rescue IOError, SystemCallError
      nil
    ensure
      conn.close unless conn.closed?
    end
  end
end

if $PROGRAM_NAME == __FILE__
  abort "usage: #{$PROGRAM_NAME} SOCKET_PATH" unless ARGV.size == 1
  trap("TERM") { exit }
  trap("INT") { exit }
  Bench::FakeDB.new(ARGV[0]).run
end
