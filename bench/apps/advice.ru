# frozen_string_literal: true

# bench/apps/advice.ru - the app of `bench/run advice`: requests that compute
# and query a stand-in database over a real socket (bench/lib/bench/fake_db.rb,
# a separate process on the UNIX socket named by FAKE_DB_SOCKET).
#
#   /work?ms=20&cpu=0.35&q=2 -> a request of mean ms milliseconds, cpu of it
#       computing: an exponentially distributed amount of this thread's CPU
#       time (mean ms x cpu) in q + 1 equal slices, with q queries between
#       them, each asking the database to answer after an exponential delay
#       of mean ms x (1 - cpu) / q; with r=N (open_loop.rb --tag) the
#       request draws from Random.new(N): the same N, the same work
#   else -> "hello"
#
# CPU is thread CPU time (time waiting for the GVL does not count as work).
# Each thread keeps one connection to the database (a pool of size = threads)
# and draws from its own Random.
require "socket"

HEADERS = { "content-type" => "text/plain" }.freeze
THREAD_CLOCK = Process::CLOCK_THREAD_CPUTIME_ID
DB_PATH = ENV.fetch("FAKE_DB_SOCKET") { abort "advice.ru: FAKE_DB_SOCKET is not set" }

def burn(seconds)
  stop = Process.clock_gettime(THREAD_CLOCK) + seconds
  a = 0
  b = 1
  while Process.clock_gettime(THREAD_CLOCK) < stop
    200.times { a, b = b, (a + b) & 0xffffffff }
  end
  a
end

def param(env, name, default)
  Float(env["QUERY_STRING"].to_s[/(?:\A|&)#{name}=([\d.]+)/, 1] || default)
end

def thread_rng = Thread.current[:advice_rng] ||= Random.new(Thread.current.object_id)
def exponential(mean, rng) = -Math.log(1.0 - rng.rand) * mean

def query(delay)
  db = (Thread.current[:advice_db] ||= UNIXSocket.new(DB_PATH))
  db.write("#{(delay * 1e6).round}\n")
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
    rng = tag ? Random.new(Integer(tag, 10)) : thread_rng
    slice = exponential(total * share, rng) / (queries + 1)
    burn(slice)
    queries.times do
      query(exponential(total * (1 - share) / queries, rng))
      burn(slice)
    end
    [200, HEADERS.merge("content-length" => "4"), ["work"]]
  else
    [200, HEADERS.merge("content-length" => "5"), ["hello"]]
  end
}
