-- wrk -s tagged.lua URL -- BASE: every request's query gets r=N, N = BASE + 1,
-- BASE + 2, ... in the order wrk sends them (one wrk thread: -t1). An app that
-- draws a request's work from Random.new(N) (bench/apps/advice.ru) then serves
-- the same work, request for request, to every run given the same BASE: runs
-- that differ in threads compare their concurrency, not their luck of the draw
-- (common random numbers). Other BASEs give other, independent sequences.
local base, n = 0, 0

init = function(args)
  base = tonumber(args[1] or "0")
end

request = function()
  n = n + 1
  local sep = string.find(wrk.path, "?", 1, true) and "&" or "?"
  return wrk.format(nil, string.format("%s%sr=%d", wrk.path, sep, base + n))
end
