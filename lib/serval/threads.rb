# frozen_string_literal: true

module Serval
  # The one place threads are made: named, crashes logged, then re-raised.
  module Threads
    module_function

    def spawn(name, log_writer)
      thread = Thread.new do
        Thread.current.name = name
        Thread.current.report_on_exception = false
        yield
      rescue Exception => e
        log_writer&.exception(e, "thread #{name} died")
        raise
      end
      # named by its creator too, so it has its name as soon as spawn returns
      # (Thread.list, `serval-worker-N` in a thread dump), however late it starts
      thread.name = name
      thread
    end
  end
end
