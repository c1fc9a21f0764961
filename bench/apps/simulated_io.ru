# frozen_string_literal: true

# bench/apps/simulated_io.ru - the background article's endpoints:
#   /simulated_io?delay=S  -> sleeps S seconds (default 1), then "simulated io"
#   else                   -> "Hello World"
HEADERS = { "content-type" => "text/plain" }.freeze

run lambda { |env|
  if env["PATH_INFO"] == "/simulated_io"
    delay = Float(env["QUERY_STRING"].to_s[/(?:\A|&)delay=([\d.]+)/, 1] || 1)
    sleep delay
    [200, HEADERS.merge("content-length" => "12"), ["simulated io"]]
  else
    [200, HEADERS.merge("content-length" => "11"), ["Hello World"]]
  end
}
