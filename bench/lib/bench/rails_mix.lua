-- wrk -s bench/lib/bench/rails_mix.lua: examples/rails' mix for the advice bench, /db 60 %, /posts 30 %, /slow?ms=80 10 %
math.randomseed(7)
request = function()
  local u = math.random()
  local path
  if u < 0.6 then path = "/db" elseif u < 0.9 then path = "/posts" else path = "/slow?ms=80" end
  return wrk.format("GET", path)
end
