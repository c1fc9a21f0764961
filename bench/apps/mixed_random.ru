# frozen_string_literal: true

# bench/apps/mixed_random.ru - like mixed.ru's /work, with random service times:
#   /work?ms=20&cpu=0.35 -> burn an exponentially distributed amount of thread
#                           CPU time (mean ms x cpu), then sleep an independent
#                           exponential time (mean ms x (1 - cpu))
#   /work?...&dist=const -> the same means without randomness (as mixed.ru)
# Each thread draws from its own Random (no lock between threads); the model
# in Serval::Advice is fed the same distributions (bench/NOTES.md, "Validation").
HEADERS = { "content-type" => "text/plain" }.freeze
THREAD_CLOCK = Process::CLOCK_THREAD_CPUTIME_ID

def burn(seconds)
  stop = Process.clock_gettime(THREAD_CLOCK) + seconds
  a = 0
  b = 1
  while Process.clock_gettime(THREAD_CLOCK) < stop
    # nil: as the block's value the assignment would build an Array each
    # iteration (millions a second, into a heap this small app never grows)
    200.times { a, b = b, (a + b) & 0xffffffff; nil }
  end
  a
end

def param(env, name, default)
  Float(env["QUERY_STRING"].to_s[/(?:\A|&)#{name}=([\d.]+)/, 1] || default)
end

def draw(mean, exponential)
  return mean unless exponential

  rng = (Thread.current[:mixed_random_rng] ||= Random.new(Thread.current.object_id))
  -Math.log(1.0 - rng.rand) * mean
end

run lambda { |env|
  if env["PATH_INFO"] == "/work"
    total = param(env, "ms", 20) / 1000.0
    cpu = param(env, "cpu", 0.35)
    exponential = !env["QUERY_STRING"].to_s.include?("dist=const")
    burn(draw(total * cpu, exponential))
    sleep(draw(total * (1 - cpu), exponential))
    [200, HEADERS.merge("content-length" => "4"), ["work"]]
  else
    [200, HEADERS.merge("content-length" => "5"), ["hello"]]
  end
}
