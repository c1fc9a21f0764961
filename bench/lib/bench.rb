# frozen_string_literal: true

# The Serval benchmark harness. Entry point: bench/run.
require_relative "bench/util"
require_relative "bench/http"
require_relative "bench/server"
require_relative "bench/wrk"
require_relative "bench/workload"
require_relative "bench/context"
require_relative "bench/runner"
require_relative "bench/report"
require_relative "bench/idle_clients"

Dir[File.join(__dir__, "bench", "servers", "*.rb")].sort.each { |f| require f }
%w[hello payload slow_readers rss].each { |w| require_relative "bench/workloads/#{w}" }
Dir[File.join(__dir__, "bench", "workloads", "*.rb")].sort.each { |f| require f }
