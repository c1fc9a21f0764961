# frozen_string_literal: true

# bench/apps/payload.ru - fixed-size bodies built once at boot.
#   /1mb    -> 1 MiB body (used by the slow_readers workload)
#   /hello  -> "Hello World"
#   /gen?mb=N -> an N MiB body generated for each request (the slow_readers_big workload)
#   else    -> 100 KiB body (the payload workload)
KB100 = ("x" * 1023 + "\n") * 100
MB1 = ("y" * 1023 + "\n") * 1024
HELLO = "Hello World"
[KB100, MB1, HELLO].each(&:freeze)

def payload_response(body)
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/1mb" then payload_response(MB1)
  when "/hello" then payload_response(HELLO)
  when "/gen" then payload_response(("g" * 1023 + "\n") * (1024 * Integer(env["QUERY_STRING"][/mb=(\d+)/, 1] || "4", 10)))
  else payload_response(KB100)
  end
}
