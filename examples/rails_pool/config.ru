# A one-controller Rails app whose only action holds a database connection for
# 0.2 s (SELECT pg_sleep(0.2)): the pool-bound case of docs/observability.md.
#
#   cd examples/rails_pool && RAILS_ENV=production POOL=3 serval -e production -t 10:10 --log-requests config.ru

require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"

class PoolApp < Rails::Application
  config.root = __dir__
  config.eager_load = true
  config.logger = Logger.new(nil)
  config.secret_key_base = "x" * 64
  config.hosts.clear
  config.active_record.maintain_test_schema = false if config.active_record.respond_to?(:maintain_test_schema=)
  routes.append { get "/sleep" => "sleep#show" }
end

class SleepController < ActionController::API
  def show
    ActiveRecord::Base.connection.select_value("SELECT pg_sleep(0.2)")
    render plain: "ok\n"
  end
end

PoolApp.initialize!
run PoolApp
