# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "zlib"
require "serval/advice"

# The logger's lock on a real app (issue 32 item 1): a window recorded from
# examples/rails (Rails 8.1, production, its logger at info to stdout,
# PostgreSQL) at 8 threads, closed loop on the bench's mix, against the lock
# waits measured in a window of the same app at 12 threads a minute later.
# Recorded with `bench/rails_lock_window a info 8` and `... a12 info 12`
# (Ruby 3.3.8, 2026-11-29 16:34-16:38 UTC; bench/NOTES.md "Session 31"). With
# the logger at warn the same app measured no lock wait at all: these waits
# are the logger's monitor.
class AdviceRailsLockWindowTest < Minitest::Test
  A = Serval::Advice
  FIXTURE = File.expand_path("../fixtures/advice/rails-logger-8t.json.gz", __dir__)
  SERVED_8 = 670.1       # req/s wrk measured over the window's closed-loop run at 8 threads
  LOCK_8 = 0.000665      # the window's own mean lock wait per request (seconds)
  LOCK_12 = 0.003196     # measured at 12 threads (the 12-thread window)
  SERVED_12 = 862.1      # req/s at 12 threads

  def window = JSON.parse(Zlib::GzipReader.open(FIXTURE, &:read), symbolize_names: true)

  def advice
    @advice ||= A.recommend(window, machine: { cpus: 1.0 }, precision: false, range: false, load_points: [])
  end

  def test_the_window_holds_the_loggers_waits
    w = A::Window.new(window)
    assert_equal 8, w.max_threads
    assert_in_delta LOCK_8, w.mean(:lock), LOCK_8 * 0.02
    assert_in_delta 0.41, w.positive_share(:lock), 0.02, "about two requests in five waited for the lock"
  end

  # Calibrated on its own window, the lock is held through the short sends
  # (a logger's writes), and the model's waits at the window's thread count
  # and load come within the calibration's own bound of the measured ones.
  def test_the_lock_is_calibrated_as_a_writers_lock_and_reproduced
    lock = advice[:lock]
    assert_equal :sends, lock[:held]
    assert lock[:reproduced], "simulated #{lock[:simulated_mean]} s against #{lock[:measured_mean]} s"
    assert_in_delta 1.0, lock[:simulated_mean] / LOCK_8, 0.25
  end

  # The prediction the lock model is for: more threads, longer waits. From
  # the 8-thread window, at 12 threads, within 25 % of what 12 threads
  # measured (a 4.8x growth), and growing with the count all the way.
  def test_the_waits_at_twelve_threads_are_predicted_from_eight
    rows = advice[:sweep].to_h { |r| [r[:threads], r] }
    at12 = rows.fetch(12)[:lock_mean]
    assert_in_delta 1.0, at12 / LOCK_12, 0.25, "model #{at12}, measured #{LOCK_12}"
    waits = (8..12).map { |t| rows.fetch(t)[:lock_mean] }
    assert_equal waits.sort, waits
  end

  # And the model serves what the window served at its own thread count,
  # and what 12 threads served within 10 %.
  def test_the_model_reproduces_the_windows_throughput
    rows = advice[:sweep].to_h { |r| [r[:threads], r[:rps]] }
    assert_in_delta 1.0, rows.fetch(8) / SERVED_8, 0.10, "model #{rows[8]}, served #{SERVED_8}"
    assert_in_delta 1.0, rows.fetch(12) / SERVED_12, 0.10, "model #{rows[12]}, served #{SERVED_12}"
  end
end
