# frozen_string_literal: true

require_relative "../test_helper"
require "serval/advice/hidden_remote"

# Advice::HiddenRemote from simulated sends: the remote takes R, the GVL
# wait makes the answer's read come T after the send, the hook only learns
# whether R < T. The estimate is checked against the true sum of the R < T.
class HiddenRemoteTest < Minitest::Test
  H = Serval::Advice::HiddenRemote
  FLOORS = [0.0] + (0...39).map { |b| (2**(12 + (b / 2))) * (b.odd? ? 1.5 : 1.0) / 1e9 }

  def bin(t) = FLOORS.rindex { |f| f <= t }

  # n sends; remote: -> R or nil for a local call (answered at once);
  # wait: -> T. Returns [bins, true hidden seconds].
  def sends(n, seed, remote:, wait:)
    rng = Random.new(seed)
    answered = Array.new(FLOORS.size, 0)
    in_wait = Array.new(FLOORS.size, 0)
    times = Array.new(FLOORS.size, 0.0)
    hidden = 0.0
    n.times do
      r = remote.call(rng)
      t = wait.call(rng)
      b = bin(t)
      times[b] += t
      if r.nil? || r < t
        in_wait[b] += 1
        hidden += r.to_f
      else
        answered[b] += 1
      end
    end
    [{ answered: answered, in_wait: in_wait, times: times }, hidden]
  end

  def exp(rng, mean) = -Math.log(1.0 - rng.rand) * mean

  def test_an_exponential_remote_behind_exponential_waits
    [[0.0065, 0.003], [0.0065, 0.008], [0.002, 0.004], [0.02, 0.002]].each_with_index do |(remote, wait), i|
      bins, truth = sends(20_000, i, remote: ->(g) { exp(g, remote) }, wait: ->(g) { exp(g, wait) })
      est = H.seconds(**bins)
      assert_in_delta truth, est, 0.05 * truth, "remote #{remote}, wait #{wait}: truth #{truth}, estimate #{est}"
    end
  end

  def test_a_fixed_remote_and_quick_sends_among_them
    # a 4 ms remote; waits uniform in 0..10 ms, a fifth of them instant (no contention)
    wait = ->(g) { g.rand < 0.2 ? 20e-6 : g.rand * 0.010 }
    bins, truth = sends(20_000, 7, remote: ->(_g) { 0.004 }, wait: wait)
    assert_in_delta truth, H.seconds(**bins), 0.05 * truth
  end

  # Local system calls (a stat() chain) look like sends answered at once:
  # at every wait. They hide nothing; a remote beside them still counts.
  def test_local_calls_hide_nothing
    wait = ->(g) { g.rand < 0.3 ? 30e-6 : exp(g, 0.004) }
    bins, = sends(20_000, 3, remote: ->(_g) {}, wait: wait)
    assert_operator H.seconds(**bins), :<, 1e-9
    mixed = ->(g) { g.rand < 0.6 ? nil : exp(g, 0.005) }
    bins, truth = sends(20_000, 4, remote: mixed, wait: wait)
    remote_hidden = truth # local calls add 0 to the truth (r.to_f of nil)
    assert_in_delta remote_hidden, H.seconds(**bins), 0.05 * remote_hidden
  end

  def test_no_contention_hides_nothing
    bins, truth = sends(5_000, 5, remote: ->(g) { exp(g, 0.005) }, wait: ->(_g) { 10e-6 })
    assert_operator truth, :<, 5_000 * 1e-7, "a few answers under 10 us"
    assert_operator H.seconds(**bins), :<, 5_000 * 1e-7
  end

  def test_too_few_sends
    bins, = sends(H::MIN_SENDS - 1, 1, remote: ->(g) { exp(g, 0.005) }, wait: ->(g) { exp(g, 0.005) })
    assert_nil H.seconds(**bins)
  end

  def test_nondecreasing_fit
    assert_equal [0.1, 0.2, 0.2, 0.5], H.nondecreasing([0.1, 0.3, 0.1, 0.5], [1, 1, 1, 1])
    assert_equal [0.25, 0.25], H.nondecreasing([0.4, 0.1], [1, 1]).map { |v| v.round(9) }
    assert_equal [0.325, 0.325], H.nondecreasing([0.4, 0.1], [3, 1]).map { |v| v.round(9) }
  end
end
