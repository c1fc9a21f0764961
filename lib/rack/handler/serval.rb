# frozen_string_literal: true

require "rack"

if Gem::Version.new(Rack.release) >= Gem::Version.new("3")
  # Rack 3 moved handlers to the rackup gem.
  require "rackup/handler/serval"
else
  require "rack/handler"
  require "serval/handler_support"

  module Rack
    module Handler
      # `rackup -s serval` and `rails server serval` on Rack 2.2.
      module Serval
        class << self
          def run(app, **options, &block)
            ::Serval::HandlerSupport.run(app, options, self, &block)
          end

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
end
