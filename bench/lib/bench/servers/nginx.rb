# frozen_string_literal: true

module Bench
  module Servers
    # nginx from Debian as the limit line, not as a Rack server: one worker
    # process answering every request with `return 200 "Hello World"` (the
    # hello app's 11-byte body, text/plain), access log off. It runs only in
    # workloads that take a limit line (Workload#limit_line?); the others
    # skip it, since it runs no app.
    class Nginx < Server
      register "nginx"

      # Binary: BENCH_NGINX, else nginx on PATH, else Debian's /usr/sbin/nginx.
      def binary
        @binary ||= ENV["BENCH_NGINX"] || Util.which("nginx") || (File.executable?("/usr/sbin/nginx") ? "/usr/sbin/nginx" : nil)
      end

      def name = "nginx"
      def rack? = false
      def opt_in? = true

      def version
        @version ||= begin
          _status, out, = Util.capture([binary, "-v"], timeout: 10)
          out[%r{nginx/(\S+)}, 1] || "unknown"
        end
      end

      def unavailable_reason
        binary ? nil : "nginx not installed (apt-get install -y nginx)"
      end

      def layout(threads:, workers: 1)
        "#{workers} worker process (return 200)"
      end

      def env = {}

      def argv(app:, port:, threads:, workers: 1, max_connections: nil)
        dir = File.join(ctx.scratch, "nginx-#{port}")
        FileUtils.mkdir_p(dir)
        path = File.join(dir, "nginx.conf")
        File.write(path, config(dir: dir, port: port, workers: workers, max_connections: max_connections || 1024))
        [binary, "-p", dir, "-c", path, "-e", File.join(dir, "error.log")]
      end

      def config(dir:, port:, workers:, max_connections:)
        <<~CONF
          daemon off;
          master_process on;
          worker_processes #{workers};
          pid #{dir}/nginx.pid;
          error_log #{dir}/error.log warn;
          events {
            worker_connections #{max_connections + 64};
            multi_accept on;
          }
          http {
            access_log off;
            keepalive_requests 1000000;
            client_body_temp_path #{dir}/body;
            proxy_temp_path #{dir}/proxy;
            fastcgi_temp_path #{dir}/fastcgi;
            uwsgi_temp_path #{dir}/uwsgi;
            scgi_temp_path #{dir}/scgi;
            server {
              listen 127.0.0.1:#{port} backlog=1024;
              location / {
                default_type text/plain;
                return 200 "Hello World";
              }
            }
          }
        CONF
      end
    end
  end
end
