# frozen_string_literal: true

require "serval/prometheus"

module Serval
  # The opt-in metrics listener (metrics_bind): GET /metrics answers the
  # launcher's stats in Prometheus text format; GET /ready answers 200 while
  # the instance should get traffic and 503 while it boots, stops (or
  # restarts) or sheds load (Serval::Capacity), for a Kubernetes
  # readinessProbe. No token: bind it to a private address.
  class MetricsApp
    PATHS = %w[/metrics /ready].freeze

    def initialize(launcher)
      @launcher = launcher
    end

    def call(env)
      return [404, { "content-type" => "text/plain" }, ["not found\n"]] unless PATHS.include?(env["PATH_INFO"])
      return [405, { "content-type" => "text/plain" }, ["only GET\n"]] unless %w[GET HEAD].include?(env["REQUEST_METHOD"])
      return ready if env["PATH_INFO"] == "/ready"

      body = Prometheus.render(@launcher.stats)
      [200, { "content-type" => Prometheus::CONTENT_TYPE, "content-length" => body.bytesize.to_s }, [body]]
    end

    private

    def ready
      status, body = @launcher.capacity.readiness
      [status, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s, "cache-control" => "no-store" },
       [body]]
    end
  end
end
