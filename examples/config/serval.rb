# frozen_string_literal: true

# Example Serval config file. Serval reads config/serval.rb (or
# config/serval/<environment>.rb) from the current directory, or the file
# given with -C FILE. Values are checked when the file is loaded; command-line
# flags win over this file. Every option: docs/configuration.md.

# Threads per process: MIN..MAX. Environment variables arrive as strings;
# Serval accepts integer strings, like Puma.
threads ENV.fetch("SERVAL_MIN_THREADS", 1), ENV.fetch("SERVAL_MAX_THREADS", 5)

# Where to listen. `port` adds tcp://HOST:PORT (HOST defaults to 0.0.0.0);
# `bind` takes a URI. Both may be repeated; the file's binds replace the default.
port ENV.fetch("PORT", 9292)
# bind "tcp://[::1]:9292"
# bind "unix:///run/serval/app.sock?mode=0660&backlog=512"

environment ENV.fetch("RACK_ENV", "development")
# rackup "config.ru"
# directory "/srv/app/current"
# pidfile "tmp/pids/serval.pid"
# tag "app-web"            # shown in the process title

# Output.
# log_requests             # one line per request on stdout
# quiet                    # no boot/stop messages

# Request limits (the native core answers 413/414/431 itself).
max_body 10 * 1024 * 1024  # bytes; larger bodies get 413
# body_spill 256 * 1024    # bodies above this go to an unlinked temp file
# max_request_line 8192
# max_head 65_536
# max_headers 128

# Timeouts in seconds.
# first_data_timeout 30    # a new connection must send its first byte
# read_timeout 30          # gap allowed between bytes of a request
persistent_timeout 20      # idle keep-alive connections are closed after this
# write_timeout 30         # a client that stops reading is dropped after this
drain_timeout 25           # TERM: time given to in-flight requests (Puma: worker_shutdown_timeout)

# Capacity.
# max_connections 1024
# max_keepalive_requests 1000
# output_buffer 4 * 1024 * 1024

# Called when the app raises before a response was sent; return a Rack response.
lowlevel_error_handler do |error, _env, status|
  [status || 500, { "content-type" => "text/plain" }, ["Something went wrong (#{error.class})\n"]]
end
