# frozen_string_literal: true

# bundle exec exe/serval examples/hello.ru
# curl http://127.0.0.1:9292/
run ->(_env) { [200, { "content-type" => "text/plain" }, ["Hello, world!\n"]] }
