# frozen_string_literal: true

module Serval
  # The one place threads are made: named, crashes logged, then re-raised.
  module Threads
    module_function

    def spawn(name, log_writer)
      Thread.new do
        Thread.current.name = name
        Thread.current.report_on_exception = false
        yield
      rescue Exception => e
        log_writer&.exception(e, "thread #{name} died")
        raise
      end
    end
  end
end
