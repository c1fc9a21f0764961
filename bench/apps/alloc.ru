# frozen_string_literal: true

# An allocation-heavy app for bench/oob_gc: each request builds ~100k short-
# lived objects (like a view render) and replaces a slice of a long-lived
# cache (a big old generation, so a major GC costs tens of ms).
CACHE = Array.new(400_000) { |i| "cached #{i}" }
run lambda { |env|
  n = (env["QUERY_STRING"][/n=(\d+)/, 1] || 100_000).to_i
  rows = Array.new(n / 4) { |i| { id: i, name: "row #{i}", tags: [i.to_s] } }
  slot = rand(CACHE.size - 2000)
  2000.times { |i| CACHE[slot + i] = "cached #{slot + i} #{rows.size}" }
  [200, { "content-type" => "text/plain" }, ["#{rows.size}\n"]]
}
