# frozen_string_literal: true

# /slow takes 200 ms of app time (a sleep: a slow query or API call);
# anything else answers at once.
run lambda { |env|
  sleep 0.2 if env["PATH_INFO"] == "/slow"
  [200, { "content-type" => "text/plain" }, ["ok"]]
}
