-- wrk -s histogram.lua: after the run, print more percentiles and a latency
-- histogram (8 buckets, log-spaced between min and max; counts placed by
-- 1000 percentiles, so approximate), in milliseconds.
-- Parsed by Bench::Wrk.parse_script.
done = function(summary, latency, requests)
  if summary.requests == 0 then return end
  local min, max = latency.min, latency.max
  io.write(string.format("minmax %.3f %.3f %.3f\n", min / 1000, latency.mean / 1000, max / 1000))
  for _, p in ipairs({ 50, 75, 90, 95, 99, 99.9, 99.99 }) do
    io.write(string.format("pct %g %.3f\n", p, latency:percentile(p) / 1000))
  end
  local buckets = 8
  local lo = math.log(math.max(min, 1))
  local hi = math.log(math.max(max, min + 1))
  local edges = {}
  for i = 1, buckets do edges[i] = math.exp(lo + (hi - lo) * i / buckets) end
  edges[buckets] = max
  local counts = {}
  for i = 1, buckets do counts[i] = 0 end
  -- This wrk cannot index its latency buckets from lua, so each of 1000
  -- equal slices of the requests is placed by its percentile.
  local steps = 1000
  local per = summary.requests / steps
  for k = 1, steps do
    local us = latency:percentile((k - 0.5) * 100 / steps)
    local b = 1
    while us > edges[b] and b < buckets do b = b + 1 end
    counts[b] = counts[b] + per
  end
  for i = 1, buckets do
    io.write(string.format("hist %.3f %d\n", edges[i] / 1000, math.floor(counts[i] + 0.5)))
  end
end
