# frozen_string_literal: true

# bench/apps/advice.ru - the app of `bench/run advice`: requests that compute
# and query a stand-in database over a real socket (bench/lib/bench/fake_db.rb,
# a separate process on the UNIX socket named by FAKE_DB_SOCKET).
#
#   /work?ms=20&cpu=0.35&q=2 -> a request of mean ms milliseconds, cpu of it
#       computing: an exponentially distributed amount of this thread's CPU
#       time (mean ms x cpu) in q + 1 equal slices, with q queries between
#       them, each asking the database to answer after an exponential delay
#       of mean ms x (1 - cpu) / q; with r=N (open_loop.rb --tag, wrk -s
#       bench/lib/bench/tagged.lua) the request draws from Random.new(N):
#       the same N, the same work; with st=B too, stratified in blocks of
#       B tags (bench/lib/bench/draws.rb)
#   else -> "hello"
#
# CPU is thread CPU time (time waiting for the GVL does not count as work).
# Each thread keeps one connection to the database (a pool of size = threads)
# and draws from its own Random.
require "socket"
require File.expand_path("../lib/bench/draws", __dir__)

HEADERS = { "content-type" => "text/plain" }.freeze
THREAD_CLOCK = Process::CLOCK_THREAD_CPUTIME_ID
DB_PATH = ENV.fetch("FAKE_DB_SOCKET") { abort "advice.ru: FAKE_DB_SOCKET is not set" }
# BURN_GARBAGE=1: the burn loop allocates as it did before session 34
# (bench/gc_runs: a small heap's back-to-back major GCs, bench/NOTES.md)
GARBAGE = ENV["BURN_GARBAGE"] == "1"
STAMP = ENV["FAKE_DB_STAMP"] == "1" # send the query's CLOCK_MONOTONIC ns too (fake_db.rb logs the remote's real time)

def burn(seconds)
  stop = Process.clock_gettime(THREAD_CLOCK) + seconds
  a = 0
  b = 1
  while Process.clock_gettime(THREAD_CLOCK) < stop
    if GARBAGE
      200.times { a, b = b, (a + b) & 0xffffffff } # the block's value: an Array an iteration
    else
      # nil: as the block's value the assignment would build an Array each
      # iteration (millions a second, into a heap this small app never grows)
      200.times { a, b = b, (a + b) & 0xffffffff; nil }
    end
  end
  a
end

def param(env, name, default)
  Float(env["QUERY_STRING"].to_s[/(?:\A|&)#{name}=([\d.]+)/, 1] || default)
end

# Untagged requests draw from a Random seeded afresh in every thread of every
# process (a thread's object_id, the seed until 2026-11-26, is the same in each
# new process, so every server replayed the same draws).
def thread_rng = Thread.current[:advice_rng] ||= Random.new
def exponential(mean, uniform) = -Math.log(1.0 - uniform) * mean


def query(delay)
  db = (Thread.current[:advice_db] ||= UNIXSocket.new(DB_PATH))
  db.write(STAMP ? "#{(delay * 1e6).round} #{Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)}\n" : "#{(delay * 1e6).round}\n")
  answer = db.gets
  raise "fake db answered #{answer.inspect}" unless answer == "ok\n"
rescue IOError, SystemCallError
  Thread.current[:advice_db]&.close
  Thread.current[:advice_db] = nil
  raise
end

run lambda { |env|
  if env["PATH_INFO"] == "/work"
    total = param(env, "ms", 20) / 1000.0
    share = param(env, "cpu", 0.35)
    queries = param(env, "q", 2).to_i
    tag = env["QUERY_STRING"].to_s[/(?:\A|&)r=(\d{1,18})(?:&|\z)/, 1]
    strata = env["QUERY_STRING"].to_s[/(?:\A|&)st=(\d{1,4})(?:&|\z)/, 1]&.then { |v| Integer(v, 10).clamp(1, 4096) }
    draws = Bench::Draws.new(tag && Integer(tag, 10), strata, thread_rng)
    slice = exponential(total * share, draws.uniform(0)) / (queries + 1)
    burn(slice)
    queries.clamp(0, 15).times do |i|
      query(exponential(total * (1 - share) / queries, draws.uniform(i + 1)))
      burn(slice)
    end
    [200, HEADERS.merge("content-length" => "4"), ["work"]]
  else
    [200, HEADERS.merge("content-length" => "5"), ["hello"]]
  end
}
