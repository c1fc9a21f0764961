# frozen_string_literal: true

require "rackup/handler"
require "serval/handler_support"

module Rackup
  module Handler
    # `rackup -s serval`, `bin/rails server serval` (Rack 3 + rackup).
    module Serval
      class << self
        # Blocks until the server stops; yields the Serval::Launcher first.
        def run(app, **options, &block)
          ::Serval::HandlerSupport.run(app, options, self, &block)
        end

        # rackup's INT trap calls this (our own traps replace it while running).
        def shutdown
          @launcher&.stop
        end

        def valid_options
          ::Serval::HandlerSupport::VALID_OPTIONS
        end
      end
    end

    register :serval, Serval
  end
end
