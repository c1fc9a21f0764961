-- wrk -s bench/lib/bench/mixed_routes.lua: bench/apps/advice_mixed.ru's routes, 60 / 30 / 10 %
math.randomseed(os.time())
request = function()
  local u = math.random()
  local path
  if u < 0.6 then
    path = "/posts/" .. math.random(1, 1000)
  elseif u < 0.9 then
    path = "/feed"
  else
    path = "/reports/" .. math.random(1, 100)
  end
  return wrk.format("GET", path)
end
