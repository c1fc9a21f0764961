# frozen_string_literal: true

module Bench
  module Workloads
    # Hello world over keep-alive: the per-request overhead of the server.
    class Hello < WrkWorkload
      register "hello"

      def name = "hello"
      def app = "hello.ru"
      def expected_bytes = 11
      def target = 1.5

      def description
        "hello world (11 bytes) over keep-alive, wrk -t1 -c#{connections}"
      end
    end
  end
end
