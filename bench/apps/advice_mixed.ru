# frozen_string_literal: true

# bench/apps/advice_mixed.ru - mixed traffic for the advice's per-route view:
# three routes over bench/apps/advice.ru's work (CPU burned, queries to the
# stand-in database on FAKE_DB_SOCKET):
#
#   /posts/:id    fast database read   5 ms, 40 % CPU, 1 query
#   /feed         view rendering      13 ms, 92 % CPU, 1 query
#   /reports/:id  slow query          81 ms,  1 % CPU, 1 query
#
# bench/lib/bench/mixed_routes.lua asks for them 60 / 30 / 10 % (bench/run advice:
# mixed_tagged.lua and open_loop.rb --mix, tagged).
work = Rack::Builder.parse_file(File.expand_path("advice.ru", __dir__))
work = work.first if work.is_a?(Array) # Rack 2: [app, options]

ROUTES = [[%r{\A/posts/\d+\z}, "ms=5&cpu=0.4&q=1"], [%r{\A/feed\z}, "ms=13&cpu=0.92&q=1"],
          [%r{\A/reports/\d+\z}, "ms=81&cpu=0.012&q=1"]].freeze

run lambda { |env|
  _, query = ROUTES.find { |re, _| re.match?(env["PATH_INFO"]) }
  next [404, { "content-type" => "text/plain", "content-length" => "0" }, []] unless query

  # the server's env keeps its path: the route key is the request's; a tag
  # (r=N, st=B: advice.ru's comment) is passed on
  tags = env["QUERY_STRING"].to_s.scan(/(?:\A|&)((?:r|st)=\d{1,18})(?=&|\z)/).flatten
  work.call(env.merge("PATH_INFO" => "/work", "QUERY_STRING" => [query, *tags].join("&")))
}
