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
        "hello world (11 bytes) over keep-alive, wrk -t1 -c#{connections}, one process on CPU #{ctx.server_cpu}"
      end
    end

    # The same with Connection: close: a new TCP connection per request.
    class HelloClose < Hello
      register "hello_close"

      def name = "hello_close"
      def target = nil
      def wrk_options = { headers: ["Connection: close"] }

      def description
        "hello world, Connection: close (a new connection per request), wrk -t1 -c#{connections}, one process on CPU #{ctx.server_cpu}"
      end
    end

    # All cores: one process per CPU (cluster mode) on every CPU; wrk stays
    # pinned to BENCH_CLIENT_CPU, so it shares that CPU with a server worker.
    class HelloCores < Hello
      register "hello_cores"

      def name = "hello_cores"
      def target = nil
      def workers = Util.nproc
      def cpus = ctx.all_cpus

      def description
        "hello world over keep-alive, all cores: #{workers} processes on CPUs #{ctx.all_cpus}, " \
          "wrk -t1 -c#{connections} on CPU #{ctx.client_cpu} (shared with the server)"
      end
    end

    class HelloCoresClose < HelloCores
      register "hello_cores_close"

      def name = "hello_cores_close"
      def wrk_options = { headers: ["Connection: close"] }

      def description
        "hello world, Connection: close, all cores: #{workers} processes on CPUs #{ctx.all_cpus}, " \
          "wrk -t1 -c#{connections} on CPU #{ctx.client_cpu} (shared with the server)"
      end
    end
  end
end
