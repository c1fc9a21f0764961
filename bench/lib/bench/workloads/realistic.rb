# frozen_string_literal: true

module Bench
  module Workloads
    # A response shaped like a real page: 25 headers and a 100 KiB body.
    class Realistic < WrkWorkload
      register "realistic"

      def name = "realistic"
      def app = "realistic.ru"
      def expected_bytes = 102_400

      def description
        "25 response headers and a 100 KiB HTML body over keep-alive, wrk -t1 -c#{connections}"
      end

      def sanity_check(process)
        super
        res = HTTP.get("127.0.0.1", process.port, "/", timeout: 5)
        # 25 app headers; the server may add date, connection, server...
        raise Error, "#{process.server.name}: only #{res.headers.size} response headers" if res.headers.size < 25
      end
    end

    # A 4 MiB upload: POST /upload, the app reads the whole body.
    class Upload < WrkWorkload
      register "upload"

      BYTES = 4 * 1024 * 1024

      def name = "upload"
      def app = "realistic.ru"
      def path = "/upload"
      def expected_bytes = nil

      def description
        "POST of a 4 MiB body (wrk -s post.lua), the app reads it all; wrk -t1 -c#{connections}"
      end

      def wrk_options
        { script: script }
      end

      def script
        path = File.join(ctx.scratch, "post_4mb.lua")
        return path if File.exist?(path)

        File.write(path, <<~LUA)
          wrk.method = "POST"
          wrk.headers["Content-Type"] = "application/octet-stream"
          wrk.body = string.rep("u", #{BYTES})
        LUA
        path
      end

      def sanity_check(process)
        super
        sock = TCPSocket.new("127.0.0.1", process.port)
        head = "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: #{BYTES}\r\nConnection: close\r\n\r\n"
        HTTP.write_all(sock, head + ("u" * BYTES), Util.now + 10)
        _status, _headers, body = HTTP.parse(HTTP.read_response(sock, Util.now + 10))
        raise Error, "#{process.server.name}: upload answered #{body.inspect}, expected #{BYTES}" unless body == BYTES.to_s
      ensure
        sock&.close
      end
    end
  end
end
