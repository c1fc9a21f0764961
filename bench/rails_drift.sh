#!/bin/bash
# Rails CPU per request over a process life: examples/rails at 8 threads, wrk -c8 in 10 s segments (bench/NOTES.md "Session 24").
# usage: CONF=<serval config> C=<checkout built for Ruby 3.3> bench/rails_drift.sh LABEL SEGMENTS
#   (extra arguments go to serval)
# examples/rails on CPU 0 at 8 threads, wrk -c8 (mixed routes) on CPU 1 in 10 s segments;
# prints per segment: req/s, CPU ms per request of the server process.
set -u
label=$1; segs=$2; shift 2
export PATH=/var/cache/serval/ruby-3.3/bin:$PATH BUNDLE_VERSION=system
C=${C:-$(cd "$(dirname "$0")/.." && pwd)}
cd $C/examples/rails
export BUNDLE_GEMFILE=$PWD/Gemfile RAILS_ENV=production SECRET_KEY_BASE=$(printf 'x%.0s' {1..64}) DB_POOL=16 RAILS_LOG_LEVEL=info
unset RAILS_MAX_THREADS WEB_CONCURRENCY METRICS_BIND
port=39${RANDOM:0:3}
taskset -c 0 bundle exec ruby -I $C/lib $C/exe/serval -C ${CONF:-config/puma.rb} -e production -b tcp://127.0.0.1:$port -t 8:8 "$@" config.ru > /tmp/rails_drift-$label.log 2>&1 &
spid=$!
for i in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:$port/up && break; sleep 0.5; done
pid=$(pgrep -P $spid -f serval | head -1); [ -z "$pid" ] && pid=$spid
# the serving process: the one listening
pid=$(ss -ltnp | grep ":$port " | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
cpu() { awk '{print $14+$15}' /proc/$pid/stat; }
for s in $(seq 1 $segs); do
  c0=$(cpu)
  out=$(taskset -c 1 wrk -t1 -c8 -d10s -s $C/bench/lib/bench/mixed_tagged.lua http://127.0.0.1:$port/ -- $((s*100000)) "/db@60,/posts@30,/slow?ms=80@10" 100 2>&1)
  c1=$(cpu)
  n=$(echo "$out" | grep -o "[0-9]* requests in" | cut -d' ' -f1)
  rps=$(echo "$out" | grep Requests/sec | awk '{print $2}')
  echo "$label seg $s rps $rps cpu_ms/req $(echo "scale=3; ($c1-$c0)*10/$n" | bc) rss_mb $(( $(awk '/VmRSS/{print $2}' /proc/$pid/status)/1024 ))"
done
kill -TERM $spid; wait $spid 2>/dev/null
