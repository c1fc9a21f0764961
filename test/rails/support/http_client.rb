# frozen_string_literal: true

require "socket"
require "securerandom"
require "cgi"
require "uri"

module RailsIntegration
  # A small HTTP/1.1 client over raw sockets: one connection per request
  # (Connection: close), a cookie jar, form helpers for Rails' CSRF token,
  # and multipart bodies streamed from a file. Every read has a deadline.
  class HttpClient
    Response = Struct.new(:status, :headers, :body, :head, :chunked) do
      def [](name) = headers[name.downcase]&.last
      def all(name) = headers[name.downcase] || []
    end

    class Error < StandardError; end

    attr_reader :port, :cookies

    def initialize(port, host: "127.0.0.1", timeout: 30)
      @host = host
      @port = port
      @timeout = timeout
      @cookies = {}
    end

    def get(path, headers: {}) = request("GET", path, headers: headers)

    # POST an application/x-www-form-urlencoded body.
    def post_form(path, fields)
      body = URI.encode_www_form(fields)
      request("POST", path, headers: { "Content-Type" => "application/x-www-form-urlencoded" }, body: body)
    end

    # GET path and return [response, authenticity_token of the form whose
    # action is form_action (the first form when nil)].
    def form_token(path, form_action: nil)
      res = get(path)
      raise Error, "GET #{path} -> #{res.status}" unless res.status == 200

      [res, self.class.token_in(res.body, form_action)]
    end

    def self.token_in(html, form_action)
      forms = html.scan(%r{<form\b[^>]*>.*?</form>}m)
      form = form_action ? forms.find { |f| f[/\baction="([^"]*)"/, 1] == form_action } : forms.first
      raise Error, "no form#{form_action && " for #{form_action}"} in:\n#{html[0, 2000]}" unless form

      token = form[/name="authenticity_token" value="([^"]+)"/, 1]
      raise Error, "no authenticity_token in the form" unless token

      CGI.unescapeHTML(token)
    end

    # The page's csrf-token meta tag (valid for any form of the session).
    def self.meta_token(html)
      token = html[/<meta name="csrf-token" content="([^"]+)"/, 1] or raise Error, "no csrf-token meta tag"
      CGI.unescapeHTML(token)
    end

    # POST multipart/form-data: fields first, then one file part whose bytes
    # are copied from the file at path (never held in memory as a String).
    def post_multipart_file(path, fields:, file_field:, file_path:, filename:, content_type:)
      boundary = "----serval#{SecureRandom.hex(12)}"
      pre = +""
      fields.each do |name, value|
        pre << "--#{boundary}\r\nContent-Disposition: form-data; name=\"#{name}\"\r\n\r\n#{value}\r\n"
      end
      pre << "--#{boundary}\r\nContent-Disposition: form-data; name=\"#{file_field}\"; filename=\"#{filename}\"\r\n" \
             "Content-Type: #{content_type}\r\n\r\n"
      post = "\r\n--#{boundary}--\r\n"
      length = pre.bytesize + File.size(file_path) + post.bytesize
      headers = { "Content-Type" => "multipart/form-data; boundary=#{boundary}", "Content-Length" => length.to_s }
      request("POST", path, headers: headers) do |socket|
        socket.write(pre)
        File.open(file_path, "rb") { |f| IO.copy_stream(f, socket) }
        socket.write(post)
      end
    end

    # One request on a new connection. The block, if given, writes the body
    # itself (headers must then carry Content-Length).
    def request(method, path, headers: {}, body: nil)
      socket = TCPSocket.new(@host, @port)
      head = +"#{method} #{path} HTTP/1.1\r\nHost: #{@host}:#{@port}\r\nConnection: close\r\n"
      head << "Cookie: #{@cookies.map { |k, v| "#{k}=#{v}" }.join('; ')}\r\n" unless @cookies.empty?
      headers.each { |k, v| head << "#{k}: #{v}\r\n" }
      head << "Content-Length: #{body.bytesize}\r\n" if body
      socket.write(head << "\r\n")
      socket.write(body) if body
      yield socket if block_given?
      response = parse(read_all(socket))
      remember_cookies(response)
      response
    ensure
      socket&.close
    end

    # Follows a redirect answer with a GET of its Location.
    def follow(response)
      location = response["location"] or raise Error, "#{response.status} without a Location"
      get(URI(location).request_uri)
    end

    private

    def read_all(socket)
      deadline = now + @timeout
      out = +"".b
      loop do
        left = deadline - now
        raise Error, "no complete response within #{@timeout}s (got #{out.bytesize} bytes)" if left <= 0
        next unless socket.wait_readable(left)

        chunk = socket.read_nonblock(1 << 16, exception: false)
        break if chunk.nil?

        out << chunk unless chunk == :wait_readable
      end
      out
    end

    def parse(raw)
      head, body = raw.split("\r\n\r\n", 2)
      raise Error, "no response head in #{raw[0, 200].inspect}" unless head && body

      lines = head.split("\r\n")
      status = lines.shift[%r{\AHTTP/1\.[01] (\d{3})}, 1].to_i
      headers = Hash.new { |h, k| h[k] = [] }
      lines.each do |line|
        name, value = line.split(":", 2)
        headers[name.strip.downcase] << value.to_s.strip
      end
      chunked = headers["transfer-encoding"].any? { |v| v.downcase.include?("chunked") }
      body = self.class.dechunk(body) if chunked
      Response.new(status, headers, body, head, chunked)
    end

    def self.dechunk(data)
      out = +"".b
      loop do
        size_line, rest = data.split("\r\n", 2)
        size = Integer(size_line.split(";", 2).first, 16)
        break if size.zero?

        out << rest.byteslice(0, size)
        data = rest.byteslice(size + 2..)
      end
      out
    end

    def remember_cookies(response)
      response.all("set-cookie").each do |line|
        pair = line.split(";", 2).first
        name, value = pair.split("=", 2)
        @cookies[name] = value
      end
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
