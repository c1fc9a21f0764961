# frozen_string_literal: true

# bench/apps/logging.ru - a CPU-bound app that logs: each request computes
# LOG_LINES + 1 bursts of CPU (LOG_CPU_MS in all, thread CPU time) with a
# Logger line written to a file between them. Logger's LogDevice holds a
# Monitor around each write, and the write gives the GVL up: another thread
# then runs, and if it logs meanwhile it waits for the monitor - until the
# writer has the GVL back. Before Serval told lock waits from I/O, those
# waits read as idle, so the app looked I/O-bound (issue 32).
#   LOG_FILE (default /tmp/serval-logging-bench.log, truncated at boot),
#   LOG_CPU_MS (default 5), LOG_LINES (default 4)
require "logger"

HEADERS = { "content-type" => "text/plain" }.freeze
THREAD_CLOCK = Process::CLOCK_THREAD_CPUTIME_ID
FILE = ENV.fetch("LOG_FILE", "/tmp/serval-logging-bench.log")
CPU = Float(ENV.fetch("LOG_CPU_MS", "5")) / 1e3
LINES = Integer(ENV.fetch("LOG_LINES", "4"))
File.write(FILE, "")
LOG = Logger.new(FILE)

def burn(seconds)
  stop = Process.clock_gettime(THREAD_CLOCK) + seconds
  a = 0
  b = 1
  a, b = b, (a + b) & 0xffffffff while Process.clock_gettime(THREAD_CLOCK) < stop
  a
end

run lambda { |env|
  slice = CPU / (LINES + 1)
  LINES.times do |i|
    burn(slice)
    LOG.info("#{env['PATH_INFO']} step #{i} #{'x' * 200}")
  end
  burn(slice)
  [200, HEADERS, ["ok\n"]]
}
