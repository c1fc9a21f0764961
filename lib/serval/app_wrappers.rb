# frozen_string_literal: true

module Serval
  # Puma options that act around the app's call, put in place once (the
  # RequestHandler's app) so they cost nothing when not configured.
  module AppWrappers
    module_function

    def wrap(app, options)
      app = FiberPerRequest.new(app) if options[:fiber_per_request]
      app = MethodGate.new(app, options[:supported_http_methods]) if options[:supported_http_methods]
      app
    end

    # supported_http_methods: a request with another method gets 501 before
    # the app (its body, if any, was already read by the event loop, so the
    # connection stays in step; it is closed anyway, as Puma does).
    class MethodGate
      HEADERS = { "content-type" => "text/plain", "connection" => "close" }.freeze

      def initialize(app, methods)
        @app = app
        @methods = methods.to_h { |m| [m, true] }.freeze
      end

      def call(env)
        return @app.call(env) if @methods.key?(env["REQUEST_METHOD"])

        body = "#{env['REQUEST_METHOD']} method is not supported\n"
        [501, HEADERS.merge("content-length" => body.bytesize.to_s), [body]]
      end
    end

    # fiber_per_request / clean_thread_locals: each call in a new Fiber, so
    # fiber locals (Thread.current[:x]) and fiber storage start empty.
    class FiberPerRequest
      def initialize(app)
        @app = app
      end

      if RUBY_VERSION >= "3.2" # fiber storage (Fiber[:x]) starts empty too, not a copy of the thread's
        def call(env)
          Fiber.new(blocking: true, storage: {}) { @app.call(env) }.resume
        end
      else
        def call(env)
          Fiber.new(blocking: true) { @app.call(env) }.resume
        end
      end
    end
  end
end
