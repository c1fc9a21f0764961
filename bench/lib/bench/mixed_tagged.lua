-- wrk -t1 -s mixed_tagged.lua URL -- BASE MIX: each request goes to one of
-- MIX's paths ("PATH@WEIGHT,PATH@WEIGHT,...") drawn by weight from a
-- sequence seeded with BASE, and its query gets r=N, N = BASE + 1, BASE + 2,
-- ... (as tagged.lua): the same BASE, the same paths and the same tagged
-- work in the same order (bench/run advice's mixed and Rails workloads).
local base, n = 0, 0
local paths, cum = {}, {}

init = function(args)
  base = tonumber(args[1] or "0")
  local total = 0
  for path, weight in string.gmatch(args[2] or "/@1", "([^,@]+)@([%d.]+)") do
    total = total + tonumber(weight)
    table.insert(paths, path)
    table.insert(cum, total)
  end
  for i = 1, #cum do cum[i] = cum[i] / total end
  math.randomseed(base % 2147483647)
end

request = function()
  n = n + 1
  local u = math.random()
  local path = paths[#paths]
  for i = 1, #cum do
    if u < cum[i] then
      path = paths[i]
      break
    end
  end
  local sep = string.find(path, "?", 1, true) and "&" or "?"
  return wrk.format(nil, string.format("%s%sr=%d", path, sep, base + n))
end
