# frozen_string_literal: true

module Serval
  # The boot handshake of the supervising process (Supervisor: Single and
  # Cluster): :new until booted (or :failed), then :booted, then :stopped.
  # Other threads (the launcher's callers, the control app's starter) wait on
  # it instead of polling.
  module BootState
    def booted?
      @state == :booted
    end

    # True once booted; false when boot failed or the timeout passed first.
    def wait_until_booted(timeout)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      @state_mutex.synchronize do
        while @state == :new
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          break if left <= 0

          @state_cond.wait(@state_mutex, left)
        end
        @state == :booted
      end
    end

    private

    def init_boot_state
      @state = :new
      @state_mutex = Mutex.new
      @state_cond = ConditionVariable.new
    end

    def change_state(state)
      @state_mutex.synchronize do
        @state = state
        @state_cond.broadcast
      end
    end
  end
end
