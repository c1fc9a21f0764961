# frozen_string_literal: true

# bench/apps/hello.ru - the smallest useful Rack app: 200, text/plain, "Hello World".
BODY = ["Hello World"].freeze
HEADERS = { "content-type" => "text/plain", "content-length" => "11" }.freeze

run ->(_env) { [200, HEADERS.dup, BODY] }
