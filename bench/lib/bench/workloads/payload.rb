# frozen_string_literal: true

module Bench
  module Workloads
    # A 100 KiB response over keep-alive: the cost of moving body bytes.
    class Payload < WrkWorkload
      register "payload"

      def name = "payload"
      def app = "payload.ru"
      def expected_bytes = 102_400
      def target = 1.0

      def description
        "100 KiB response over keep-alive, wrk -t1 -c#{connections}"
      end
    end
  end
end
