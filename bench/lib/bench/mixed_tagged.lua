-- wrk -t1 -s mixed_tagged.lua URL -- BASE MIX [BLOCK]: each request goes to
-- one of MIX's paths ("PATH@WEIGHT,PATH@WEIGHT,...") drawn by weight from a
-- sequence seeded with BASE, and its query gets r=N, N = BASE + 1, BASE + 2,
-- ... (as tagged.lua): the same BASE, the same paths and the same tagged
-- work in the same order (bench/run advice's mixed and Rails workloads).
-- With BLOCK, the paths are stratified: every BLOCK consecutive requests
-- hold each path in proportion to its weight (rounded), in a shuffled order,
-- so that a short run's share of slow requests is not luck (iid, a 3 s
-- point of ~300 requests with 10 % slow ones holds 30 +- 5 of them).
local base, n = 0, 0
local paths, weights, cum = {}, {}, {}
local block, deck, dealt = 0, {}, 0

init = function(args)
  base = tonumber(args[1] or "0")
  local total = 0
  for path, weight in string.gmatch(args[2] or "/@1", "([^,@]+)@([%d.]+)") do
    total = total + tonumber(weight)
    table.insert(paths, path)
    table.insert(weights, tonumber(weight))
    table.insert(cum, total)
  end
  for i = 1, #cum do cum[i] = cum[i] / total end
  block = tonumber(args[3] or "0")
  if block > 0 then
    local given = 0
    for i = 1, #paths do
      local k = math.floor(block * weights[i] / total + 0.5)
      if i == #paths then k = block - given end
      for _ = 1, k do table.insert(deck, i) end
      given = given + k
    end
    dealt = #deck
  end
  math.randomseed(base % 2147483647)
end

local function next_path()
  if block > 0 and #deck > 0 then
    if dealt >= #deck then
      for i = #deck, 2, -1 do
        local j = math.random(i)
        deck[i], deck[j] = deck[j], deck[i]
      end
      dealt = 0
    end
    dealt = dealt + 1
    return paths[deck[dealt]]
  end
  local u = math.random()
  for i = 1, #cum do
    if u < cum[i] then return paths[i] end
  end
  return paths[#paths]
end

request = function()
  n = n + 1
  local path = next_path()
  local sep = string.find(path, "?", 1, true) and "&" or "?"
  return wrk.format(nil, string.format("%s%sr=%d", path, sep, base + n))
end
