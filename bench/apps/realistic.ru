# frozen_string_literal: true

# bench/apps/realistic.ru - a response shaped like a real page, and an upload.
#   GET  /        -> 200 with 25 headers (cookies, caching, security headers)
#                    and a 100 KiB HTML body
#   POST /upload  -> reads the whole request body, answers its size
#   GET  /upload  -> "0"
BODY = (("<div class=\"row\">" + ("x" * 1000) + "</div>\n") * 100).freeze
HEADERS = {
  "content-type" => "text/html; charset=utf-8",
  "content-length" => BODY.bytesize.to_s,
  "cache-control" => "max-age=0, private, must-revalidate",
  "etag" => "W/\"5d41402abc4b2a76b9719d911017c592\"",
  "last-modified" => "Sat, 21 Nov 2026 10:00:00 GMT",
  "vary" => "Accept, Accept-Encoding, Origin",
  "x-frame-options" => "SAMEORIGIN",
  "x-xss-protection" => "0",
  "x-content-type-options" => "nosniff",
  "x-permitted-cross-domain-policies" => "none",
  "referrer-policy" => "strict-origin-when-cross-origin",
  "content-security-policy" => "default-src 'self'; img-src 'self' data:; script-src 'self'",
  "strict-transport-security" => "max-age=63072000; includeSubDomains",
  "permissions-policy" => "camera=(), microphone=(), geolocation=()",
  "x-request-id" => "6f1c2e4a-7b8d-4c3e-9a1f-2b3c4d5e6f70",
  "x-runtime" => "0.012345",
  "server-timing" => "db;dur=3.2, view;dur=6.1, total;dur=12.3",
  "set-cookie" => "_app_session=abcdef0123456789abcdef0123456789; path=/; secure; httponly; samesite=lax",
  "link" => "</assets/application.css>; rel=preload; as=style",
  "access-control-allow-origin" => "https://example.com",
  "access-control-allow-credentials" => "true",
  "cross-origin-opener-policy" => "same-origin",
  "cross-origin-resource-policy" => "same-origin",
  "x-dns-prefetch-control" => "off",
  "x-download-options" => "noopen"
}.freeze

run lambda { |env|
  if env["PATH_INFO"] == "/upload"
    input = env["rack.input"]
    size = 0
    buf = +""
    if input
      while input.read(65_536, buf)
        size += buf.bytesize
      end
    end
    body = size.to_s
    [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
  else
    [200, HEADERS.dup, [BODY]]
  end
}
