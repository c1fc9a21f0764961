# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice"
require "serval/timing"

# Mixed traffic: a recorded window of fast database reads, view rendering
# and slow queries, its routes reported most time first, each top route's
# own knee, cardinality bounded; and the route key a request gets.
class AdviceRoutesTest < Minitest::Test
  A = Serval::Advice
  FAST = { sim_requests: 5000, load_requests: 5000, precision: false, load_points: [] }.freeze
  # route => [share of requests, mean run, mean idle] (seconds)
  MIX = { "GET /posts/:id" => [0.6, 0.002, 0.003],      # fast DB read
          "GET /feed" => [0.3, 0.012, 0.001],           # view rendering
          "GET /reports/:id" => [0.1, 0.001, 0.080] }.freeze # slow query

  def self.exp(rng, mean) = -Math.log(1.0 - rng.rand) * mean

  def self.mixed(n, seed: 5, extra_routes: 0)
    rng = Random.new(seed)
    Array.new(n) do |i|
      u = rng.rand
      route, (_, run, idle) = MIX.find { |_, (share, *)| (u -= share).negative? } || MIX.to_a.last
      route = "GET /r#{i % extra_routes}" if extra_routes.positive? && i.odd?
      r = exp(rng, run)
      d = exp(rng, idle)
      { route: route, run: r, idle: d, stall: 0.0, wall: r + d }
    end
  end

  def window(samples) = { requests: samples.size, max_threads: 4, gvl_split: true, samples: samples }
  def advise(win, **opts) = A.recommend(win, machine: { cpus: 1.0 }, **FAST, **opts)

  def test_routes_most_time_first_with_their_own_knees
    samples = self.class.mixed(3000)
    r = advise(window(samples))
    routes = r[:routes]
    # time per request: reports 0.1 x 81 ms, feed 0.3 x 13 ms, posts 0.6 x 5 ms
    assert_equal ["GET /reports/:id", "GET /feed", "GET /posts/:id"], routes.map { |x| x[:route] }
    assert_in_delta 0.6, routes.last[:share_requests], 0.03
    assert_in_delta 1.0, routes.sum { |x| x[:share_requests] }, 0.001
    assert_in_delta 1.0, routes.sum { |x| x[:share_time] }, 0.001
    feed = routes.find { |x| x[:route] == "GET /feed" }
    slow = routes.find { |x| x[:route] == "GET /reports/:id" }
    assert_operator feed[:cpu_share], :>, 0.85
    assert_operator slow[:cpu_share], :<, 0.05
    assert_operator feed[:alone], :<=, 2, "rendering alone: little to gain from threads"
    assert_operator slow[:alone], :>, r[:threads], "slow queries alone want more threads than the mix"
    # the mix's knee is the mix's, not one route's
    assert_operator r[:threads], :>, feed[:alone]
    pooled = samples.sum { |s| s[:run] } / samples.sum { |s| s[:run] + s[:idle] }
    assert_in_delta pooled, r[:cpu_share], 0.01
  end

  def test_cardinality_is_bounded
    rows = A::Routes.call(self.class.mixed(2000, extra_routes: 40))
    assert_equal A::Routes::TOP + 1, rows.size
    assert_equal "other", rows.last[:route]
    assert_equal 2000, rows.sum { |x| x[:samples] }
  end

  def test_no_routes_without_route_keys
    samples = self.class.mixed(500).map { |s| s.except(:route) }
    assert_nil advise(window(samples))[:routes]
  end

  def test_route_key
    k = ->(env) { Serval::Timing.route_key({ "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "" }.merge(env)) }
    assert_equal "GET /posts/:id/comments/:id", k.call("PATH_INFO" => "/posts/42/comments/7.json")
    assert_equal "GET /u/:id", k.call("PATH_INFO" => "/u/550e8400-e29b-41d4-a716-446655440000")
    assert_equal "GET /t/:id/settings", k.call("PATH_INFO" => "/t/abcdef0123456789abcd/settings")
    assert_equal "GET /about-our-company-and-team", k.call("PATH_INFO" => "/about-our-company-and-team")
    assert_equal "GET /posts/:id(.:format)",
                 k.call("PATH_INFO" => "/posts/1", "action_dispatch.route_uri_pattern" => "/posts/:id(.:format)")
    assert_equal "GET users#show", k.call("PATH_INFO" => "/u/1",
                                          "action_dispatch.request.path_parameters" => { controller: "users", action: "show" })
    assert_equal "GET /", k.call("PATH_INFO" => "")
    long = k.call("PATH_INFO" => "/a" * 500)
    assert_equal Serval::Timing::ROUTE_MAX, long.size
  end

  # route_key remembers the keys it made (the same request's key again is a
  # lookup): the same key for the same method and path, a fresh one for
  # another method; at most ROUTE_MEMO_MAX paths of at most ROUTE_MEMO_BYTES.
  def test_route_keys_are_remembered_within_bounds
    t = Serval::Timing
    k = ->(method, path) { t.route_key({ "REQUEST_METHOD" => method, "SCRIPT_NAME" => "", "PATH_INFO" => +path }) }
    first = k.call("GET", "/memo/42")
    assert_same first, k.call("GET", "/memo/42")
    assert first.frozen?
    assert_equal "POST /memo/:id", k.call("POST", "/memo/42")
    assert_equal "GET /mount/memo/:id", t.route_key({ "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "/mount", "PATH_INFO" => "/memo/7" })
    long = "/#{'x' * t::ROUTE_MEMO_BYTES}"
    refute_same k.call("GET", long), k.call("GET", long), "a path over ROUTE_MEMO_BYTES is not kept"
    (t::ROUTE_MEMO_MAX + 10).times { |i| assert_equal "GET /many/p#{i}", k.call("GET", "/many/p#{i}") }
    kept = t.instance_variable_get(:@route_memo).sum { |_m, by| by.size }
    assert_operator kept, :<=, t::ROUTE_MEMO_MAX
    assert_operator kept, :>=, 1
  end
end
