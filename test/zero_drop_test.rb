# frozen_string_literal: true

require_relative "test_helper"
require "support/subprocess_server"
require "support/http_wire"

# Under continuous load (4 client threads, keep-alive connections of 1..5
# requests and new connections) no request is lost across a hot restart,
# a phased restart, TTOU or a graceful stop. Counting rules: HttpWire::LoadClient.
class ZeroDropTest < Minitest::Test
  include Serval::SubprocessHelpers

  APP = %(run ->(env) { [200, {"content-type" => "text/plain"}, ["ok \#{Process.pid}"]] }\n)
  LOAD_BEFORE = 300 # successful requests before the event
  LOAD_AFTER = 300  # successful requests after it

  def cluster(workers: 2)
    config = "bind 'tcp://127.0.0.1:0'\nthreads 2, 2\nworkers #{workers}\nworker_check_interval 0.2\n"
    server = spawn_server(["-C", "c.rb"], files: { "config.ru" => APP, "c.rb" => config }).boot
    server.wait_for(/Worker #{workers - 1} \(PID: \d+\) booted/)
    server
  end

  def under_load(server)
    load = Serval::HttpWire::LoadClient.new(server.port, threads: 4).start
    assert load.wait_for_more(LOAD_BEFORE), "no load before the event"
    yield load
    load.wait_for_more(LOAD_AFTER) unless load.refusing?
    result = load.stop
    assert_equal 0, result.failed, "failures: #{result.errors.inspect}\n#{server.logs}"
    assert_operator result.ok, :>=, LOAD_BEFORE
    result
  end

  def test_hot_restart_drops_nothing
    server = cluster
    under_load(server) do
      server.signal("USR2")
      server.wait_for(/Adopted restart fd/)
      # two workers before the exec, two of the new master after it
      server.wait_for_count(/Worker \d \(PID: \d+\) booted/, 4, timeout: 15)
    end
  end

  def test_phased_restart_drops_nothing
    server = cluster
    under_load(server) do
      server.signal("USR1")
      server.wait_for(/Worker 1 \(PID: \d+\) booted in [\d.]+s, phase: 1/, timeout: 15)
      server.wait_for(/Worker 0 \(PID: \d+\) booted in [\d.]+s, phase: 1/, timeout: 15)
    end
  end

  def test_ttou_drops_nothing
    server = cluster(workers: 3)
    under_load(server) do
      server.signal("TTOU")
      server.wait_for(/- Stopping worker 2/)
      server.wait_for(/- Worker 2 \(PID: \d+\) stopped/, timeout: 15)
    end
    refute_match(/Worker 2 .*respawning/, server.stderr)
  end

  # Graceful stop: every request sent before the stop got its answer; after
  # the stop began, connections that were refused or reset before an answer
  # count as refused, not failed (the server no longer listens).
  def test_graceful_stop_drops_nothing
    server = cluster
    # under_load asserts the property: 0 failed (refusals after the stop are
    # allowed and need not happen).
    under_load(server) do |load|
      load.refuse_from_now
      server.signal("TERM")
      assert server.wait(15), server.logs
      assert server.status.success?
    end
  end
end
