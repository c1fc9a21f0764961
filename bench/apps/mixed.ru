# frozen_string_literal: true

# bench/apps/mixed.ru - requests that mix CPU (holding the GVL) and waiting,
# like Puma's test/rackup/sleep_fibonacci.ru.
#   /work?ms=20&cpu=0.7 -> burn ms x cpu of this thread's CPU time, then sleep
#                          for the rest of ms (default 20 ms, 70 % CPU)
#   /io?n=6&ms=10       -> n sleeps of ms each: an I/O-bound request with n
#                          blocking calls (default 6 x 10 ms = 60 ms)
#   /cpu?seconds=S      -> compute for S seconds of wall time (default 5)
#   else                -> "Hello World"
HEADERS = { "content-type" => "text/plain" }.freeze
THREAD_CLOCK = Process::CLOCK_THREAD_CPUTIME_ID

# Spin until this thread has used `seconds` of CPU time. Thread CPU time, not
# wall time: a thread that waits for the GVL does not count as computing.
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

# Compute until a wall-clock deadline (never blocking, so holding the GVL).
def spin_until(deadline)
  a = 0
  a += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  a
end

def param(env, name, default)
  Float(env["QUERY_STRING"].to_s[/(?:\A|&)#{name}=([\d.]+)/, 1] || default)
end

def text(body)
  [200, HEADERS.merge("content-length" => body.bytesize.to_s), [body]]
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/work"
    total = param(env, "ms", 20) / 1000.0
    cpu = param(env, "cpu", 0.7)
    burn(total * cpu)
    sleep(total * (1 - cpu))
    text("work")
  when "/io"
    param(env, "n", 6).to_i.times { sleep(param(env, "ms", 10) / 1000.0) }
    text("io")
  when "/cpu"
    spin_until(Process.clock_gettime(Process::CLOCK_MONOTONIC) + param(env, "seconds", 5))
    text("cpu")
  else
    text("Hello World")
  end
}
