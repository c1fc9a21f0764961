# frozen_string_literal: true

require "serval/prometheus"

module Serval
  # The opt-in metrics listener (metrics_bind): GET /metrics answers the
  # launcher's stats in Prometheus text format. No token: bind it to a
  # private address.
  class MetricsApp
    def initialize(launcher)
      @launcher = launcher
    end

    def call(env)
      return [404, { "content-type" => "text/plain" }, ["not found\n"]] unless env["PATH_INFO"] == "/metrics"
      return [405, { "content-type" => "text/plain" }, ["only GET\n"]] unless %w[GET HEAD].include?(env["REQUEST_METHOD"])

      body = Prometheus.render(@launcher.stats)
      [200, { "content-type" => Prometheus::CONTENT_TYPE, "content-length" => body.bytesize.to_s }, [body]]
    end
  end
end
