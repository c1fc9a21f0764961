# frozen_string_literal: true

require "rack"
require "rack/files"
require "rack/body_proxy"

module Serval
  # The Rack responses of test/response_differential_test.rb: one app that
  # both Puma and Serval run (config.ru requires this file), one case per
  # path /c/NAME, and /ping to check that a keep-alive connection still works
  # after a case. Each case says how it is requested and what is expected of
  # Serval beyond "at least as well as Puma":
  #   same:    header names whose values must be the same under both servers
  #   refuses: Serval answers 500 on purpose (the logged cause matches it)
  #   gap:     Serval does worse than Puma today (not header/status code: the
  #            body writer); checked only for "no desynchronised connection"
  module ResponseCases
    Case = Struct.new(:name, :response, :method, :version, :headers, :same, :refuses, :gap, keyword_init: true) do
      def path
        "/c/#{name}"
      end

      def head?
        method == "HEAD"
      end

      def request
        lines = ["#{method} #{path} HTTP/#{version}"]
        lines << "Host: diff.test" if version == "1.1"
        headers.each { |k, v| lines << "#{k}: #{v}" }
        "#{lines.join("\r\n")}\r\n\r\n"
      end
    end

    # An enumerable body that is not an Array (chunked under both servers).
    class Each
      def initialize(*chunks)
        @chunks = chunks
      end

      def each(&block)
        @chunks.each(&block)
      end
    end

    # A to_path body with each (Puma and Serval both send the file).
    class PathBody
      def initialize(path)
        @path = path
      end

      def to_path
        @path
      end

      def each
        yield File.binread(@path)
      end
    end

    FILE_DIR = File.expand_path("../fixtures/differential", __dir__)
    FILE = File.join(FILE_DIR, "ten.txt") # "0123456789"
    TEXT = { "content-type" => "text/plain" }.freeze
    FILES = Rack::Files.new(FILE_DIR)

    CASES = []

    def self.add(name, method: "GET", version: "1.1", headers: {}, same: [], refuses: nil, gap: nil, &response)
      CASES << Case.new(name: name, response: response, method: method, version: version, headers: headers,
                        same: same, refuses: refuses, gap: gap)
    end

    # header values that are not Strings, and odd Strings
    add("nil_value", same: ["x-v"]) { [200, { "x-v" => nil }, ["ok"]] }
    add("integer_value", same: ["x-v"]) { [200, { "x-v" => 5 }, ["ok"]] }
    add("symbol_value", same: ["x-v"]) { [200, { "x-v" => :abc }, ["ok"]] }
    add("float_value", same: ["x-v"]) { [200, { "x-v" => 1.5 }, ["ok"]] }
    add("array_value", same: ["x-v"]) { [200, { "x-v" => %w[a b] }, ["ok"]] }
    add("array_with_nil_and_integer", same: ["x-v"]) { [200, { "x-v" => ["a", nil, 3] }, ["ok"]] }
    add("empty_array") { [200, { "x-v" => [] }, ["ok"]] } # Puma writes "x-v: []", Serval nothing
    add("empty_string", same: ["x-v"]) { [200, { "x-v" => "" }, ["ok"]] }
    add("nil_value_each_body", same: ["x-v"]) { [200, { "x-v" => nil }, Each.new("o", "k")] }
    add("nil_value_head", method: "HEAD", same: ["x-v"]) { [200, { "x-v" => nil }, []] }
    add("lf_in_value", same: ["x-v"]) { [200, { "x-v" => "a\nb" }, ["ok"]] }
    add("trailing_lf", same: ["x-v"]) { [200, { "x-v" => "a\n" }, ["ok"]] }
    add("tab_in_value", same: ["x-v"]) { [200, { "x-v" => "a\tb" }, ["ok"]] }
    add("non_ascii_value", same: ["x-v"]) { [200, { "x-v" => "caf\u00e9" }, ["ok"]] }
    add("binary_value", same: ["x-v"]) { [200, { "x-v" => "\xFF\xFE".b }, ["ok"]] }
    add("crlf_in_value", refuses: /response header x-v: control character 0x0d/) { [200, { "x-v" => "a\r\nb" }, ["ok"]] }
    add("response_splitting", refuses: /control character 0x0d/) do
      [200, { "x-v" => "x\r\nset-cookie: evil=1" }, ["ok"]]
    end
    add("cr_in_value", refuses: /control character 0x0d/) { [200, { "x-v" => "a\rb" }, ["ok"]] }
    add("nul_in_value", refuses: /control character 0x00/) { [200, { "x-v" => "a\0b" }, ["ok"]] }
    # header names
    add("uppercase_name", same: ["x-upper"]) { [200, { "X-Upper" => "v" }, ["ok"]] }
    add("symbol_name", same: ["x_sym"]) { [200, { x_sym: "v" }, ["ok"]] }
    add("name_with_space", refuses: /invalid response header name "bad name"/) { [200, { "bad name" => "v" }, ["ok"]] }
    add("name_with_colon", refuses: /invalid response header name "bad:name"/) { [200, { "bad:name" => "v" }, ["ok"]] }
    add("name_with_crlf", refuses: /invalid response header name/) { [200, { "x\r\ny" => "v" }, ["ok"]] }
    add("rack_header", same: ["rack.session"]) { [200, { "rack.session" => "s" }, ["ok"]] }
    # content-length and transfer-encoding from the app
    add("duplicate_content_length_same", same: ["content-length"]) do
      [200, { "content-length" => "2", "Content-Length" => "2" }, ["ok"]]
    end
    add("duplicate_content_length_differ", refuses: /two content-length response headers that differ/) do
      [200, { "content-length" => "2", "Content-Length" => "3" }, ["ok"]]
    end
    add("content_length_too_big") { [200, { "content-length" => "10" }, ["hello"]] }
    add("content_length_too_small") { [200, { "content-length" => "2" }, ["hello"]] }
    add("content_length_integer", same: ["content-length"]) { [200, { "content-length" => 5 }, ["hello"]] }
    add("content_length_nil", same: ["content-length"]) { [200, { "content-length" => nil }, ["hello"]] }
    add("content_length_invalid", refuses: /invalid content-length response header "abc"/) do
      [200, { "content-length" => "abc" }, ["hello"]]
    end
    add("transfer_encoding_prechunked") { [200, { "transfer-encoding" => "chunked" }, ["5\r\nhello\r\n0\r\n\r\n"]] }
    add("transfer_encoding_unchunked") { [200, { "transfer-encoding" => "chunked" }, ["hello"]] }
    # statuses
    add("status_string") { ["200", TEXT.dup, ["ok"]] }
    add("status_string_with_reason") { ["201 Created", TEXT.dup, ["ok"]] }
    add("status_float") { [202.0, TEXT.dup, ["ok"]] }
    add("status_599") { [599, TEXT.dup, ["ok"]] }
    add("status_1xx", refuses: /status 100 is informational/) { [100, TEXT.dup, ["ok"]] }
    add("status_invalid_string", refuses: /invalid status "abc"/) { ["abc", TEXT.dup, ["ok"]] }
    add("status_nil", refuses: /invalid status nil/) { [nil, TEXT.dup, ["ok"]] }
    add("status_four_digits", refuses: /invalid status 1000/) { [1000, TEXT.dup, ["ok"]] }
    # bodies
    add("array_body") { [200, TEXT.dup, %w[a b c]] }
    add("empty_array_body") { [200, TEXT.dup, []] }
    add("array_of_non_strings") { [200, TEXT.dup, ["ok", 1]] }
    add("array_with_nil") do
      [200, TEXT.dup, ["ok", nil]]
    end
    add("each_body") { [200, TEXT.dup, Each.new("a", "", "b")] }
    add("each_yielding_nil") do
      [200, TEXT.dup, Each.new("a", nil, "b")]
    end
    add("enumerator_body") { [200, TEXT.dup, %w[a b].each] }
    add("empty_each_body") { [200, TEXT.dup, Each.new] }
    add("to_path_body") { [200, TEXT.dup, PathBody.new(FILE)] }
    add("to_path_with_length") { [200, TEXT.merge("content-length" => "10"), PathBody.new(FILE)] }
    add("call_body") do
      [200, TEXT.dup, lambda { |stream|
        stream.write("a")
        stream.write("b")
        stream.close
      }]
    end
    add("body_proxy") { [200, TEXT.dup, Rack::BodyProxy.new(["proxied"]) {}] }
    add("body_proxy_each") { [200, TEXT.dup, Rack::BodyProxy.new(Each.new("p", "e")) {}] }
    # no body
    add("head_array_body", method: "HEAD", same: ["content-length"]) { [200, TEXT.dup, ["hello"]] }
    add("head_each_body", method: "HEAD") { [200, TEXT.dup, Each.new("hello")] }
    add("status_204") { [204, {}, []] }
    add("status_204_with_length") { [204, { "content-length" => "0" }, []] }
    add("status_304_with_length") { [304, { "content-length" => "5" }, []] }
    add("http10_each_body", version: "1.0") { [200, TEXT.dup, Each.new("a", "b")] }
    add("http10_keep_alive", version: "1.0", headers: { "Connection" => "keep-alive" }) { [200, TEXT.dup, ["ok"]] }
    # Rack::Files (its own content-length; ranges)
    add("files_whole") { |env| FILES.call(env.merge("PATH_INFO" => "/ten.txt")) }
    add("files_head", method: "HEAD") { |env| FILES.call(env.merge("PATH_INFO" => "/ten.txt")) }
    add("files_range", headers: { "Range" => "bytes=2-5" }) { |env| FILES.call(env.merge("PATH_INFO" => "/ten.txt")) }
    add("files_suffix_range", headers: { "Range" => "bytes=-3" }) { |env| FILES.call(env.merge("PATH_INFO" => "/ten.txt")) }
    add("files_multi_range", headers: { "Range" => "bytes=0-1,4-5" }) do |env|
      FILES.call(env.merge("PATH_INFO" => "/ten.txt"))
    end
    add("files_unsatisfiable", headers: { "Range" => "bytes=50-60" }) do |env|
      FILES.call(env.merge("PATH_INFO" => "/ten.txt"))
    end

    BY_PATH = CASES.to_h { |c| [c.path, c] }.freeze
    CASES.freeze

    APP = lambda do |env|
      path = env["PATH_INFO"]
      next [200, TEXT.dup, ["pong"]] if path == "/ping"

      kase = BY_PATH[path]
      kase ? kase.response.call(env) : [404, TEXT.dup, ["no case #{path}\n"]]
    end
  end
end
