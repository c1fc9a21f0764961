# frozen_string_literal: true

module Serval
  # What a forked child must close of its parent's listeners (the control
  # app's, the agent-check's): those features register here when they start,
  # and only then is Process._fork wrapped (Ruby >= 3.1 calls it for every
  # fork: Process.fork, Kernel#fork, IO.popen("-"), an app's or a plugin's
  # fork as well as the cluster's workers). Requiring Serval changes no core
  # class; a process that never starts such a feature is never patched. Once
  # installed the wrapper stays for the process's life (a prepended module
  # cannot be removed); with nothing registered it only calls super.
  #
  #   Serval::ForkHook.on_child(Serval::Control) { Serval::Control.after_fork_child }
  module ForkHook
    @callbacks = {}.freeze # replaced, never changed: the child reads it without a lock
    @mutex = Mutex.new

    class << self
      # Runs block in every child forked from now on (one block per key).
      def on_child(key, &block)
        raise ArgumentError, "a block to run in the child" unless block

        @mutex.synchronize do
          install
          @callbacks = @callbacks.merge(key => block).freeze
        end
        key
      end

      def installed? = Process.singleton_class.include?(Wrapper)

      # In the child, right after the fork.
      def run_child
        @mutex = Mutex.new # another thread may have held it at the fork
        @callbacks.each_value(&:call)
      end

      private

      def install
        Process.singleton_class.prepend(Wrapper) unless installed?
      end
    end

    # Prepended to Process's singleton class by ForkHook.install.
    module Wrapper
      def _fork
        pid = super
        ForkHook.run_child if pid.zero?
        pid
      end
    end
  end
end
