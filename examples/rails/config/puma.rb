# This configuration file will be evaluated by Puma. The top-level methods that
# are invoked here are part of Puma's configuration DSL. For more information
# about methods provided by the DSL, see https://puma.io/puma/Puma/DSL.html.
#
# Puma starts a configurable number of processes (workers) and each process
# serves each request in a thread from an internal thread pool.
#
# You can control the number of workers using ENV["WEB_CONCURRENCY"]. You
# should only set this value when you want to run 2 or more workers. The
# default is already 1. You can set it to `auto` to automatically start a worker
# for each available processor.
#
# The ideal number of threads per worker depends both on how much time the
# application spends waiting for IO operations and on how much you wish to
# prioritize throughput over latency.
#
# As a rule of thumb, increasing the number of threads will increase how much
# traffic a given process can handle (throughput), but due to CRuby's
# Global VM Lock (GVL) it has diminishing returns and will degrade the
# response time (latency) of the application.
#
# The default is set to 3 threads as it's deemed a decent compromise between
# throughput and latency for the average Rails application.
#
# Any libraries that use a connection pool or another resource pool should
# be configured to provide at least as many connections as the number of
# threads. This includes Active Record's `pool` parameter in `database.yml`.
threads_count = ENV.fetch("RAILS_MAX_THREADS", 3)
threads threads_count, threads_count

# Specifies the `port` that Puma will listen on to receive requests; default is 3000.
port ENV.fetch("PORT", 3000)

# Allow puma to be restarted by `bin/rails restart` command.
plugin :tmp_restart

# Run the Solid Queue supervisor inside of Puma for single-server deployments.
plugin :solid_queue if ENV["SOLID_QUEUE_IN_PUMA"]

# Specify the PID file. Defaults to tmp/pids/server.pid in development.
# In other environments, only set the PID file if requested.
pidfile ENV["PIDFILE"] if ENV["PIDFILE"]

# --- Added for Serval (docs/rails.md). Puma reads the lines above and these
# unchanged; `serval -C config/puma.rb` and `bin/rails server -u serval` too.

# Uploads up to 256 MiB (the 150 MB Active Storage upload in CI), stated
# here rather than left to the server's default body limit.
http_content_length_limit 256 * 1024 * 1024

# Prometheus metrics, including the Active Record pool figures
# (serval_db_pool_*). Serval only: Puma's DSL has no metrics_bind.
metrics_bind ENV["METRICS_BIND"] if ENV["METRICS_BIND"] && respond_to?(:metrics_bind)

# pool_wait: how long requests wait for a database connection (the
# serval_request_pool_wait_seconds histogram, the access log's pool_wait=).
# Off by default: it wraps a private Active Record method. Serval only.
db_pool_wait true if respond_to?(:db_pool_wait)
