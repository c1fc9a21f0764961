# frozen_string_literal: true

require "serval/commands"

require "io/wait"

module Serval
  # Signals and programmatic commands share one self-pipe. A trap handler only
  # writes the command's name into the pipe; the process's loop reads names
  # back with #wait or #read and hands each to its handler (Commands.dispatch).
  #
  #   signals = Serval::Signals.new
  #   signals.install(Serval::Signals::MASTER)
  #   signals.wait(5)   # => [:stop] (commands, in arrival order; [] on timeout)
  #
  # The three tables below are views of lib/serval/commands.rb's one table.
  class Signals
    DUMP_SIGNAL = Commands::DUMP_SIGNAL

    # signal => command in single mode.
    SINGLE = Commands::SIGNALS

    # signal => command in the cluster master: SINGLE, plus SIGCHLD to reap
    # an exited worker at once.
    MASTER = SINGLE.merge("CHLD" => :child).freeze

    # signal => command in a cluster worker: the commands it acts on
    # (Commands::WORKER); a master's signal sent to it by mistake is ignored.
    WORKER = SINGLE.transform_values { |c| Commands::WORKER.include?(c) ? c : :ignore }
                   .merge("CHLD" => :ignore).freeze

    attr_reader :reader

    EARLY_MAX = 16

    class << self
      # Whether this process got SIGTERM (raise_exception_on_sigterm: the
      # CLI then ends the process by that signal, as Puma does).
      def term_received? = !!@term_received

      attr_writer :term_received

      # Around the fork of a worker: the child (and a mold's middle process)
      # inherits the flag, so its inherited handlers keep what they get for
      # the worker (#early_push) instead of acting on it.
      def forking_worker
        @worker_fork = true
        yield
      ensure
        @worker_fork = false
      end

      # A process forked from the one that installed the handlers runs them
      # too; nothing it gets is written into the parent's pipe (a worker
      # stopped as it booted stopped the master). A worker to be keeps the
      # command (#take_early hands it to its own Signals); any other child
      # (one the app or a plugin forks) is ended by the signal's system
      # default on a stop or halt, and ignores the rest. Not by raising:
      # a child forked in a request thread would unwind through the copy
      # of Serval's frames and answer the parent's client.
      def early_push(command)
        unless @worker_fork
          sig = { stop: "TERM", halt: "INT" }[command]
          return nil unless sig

          Signal.trap(sig, "SYSTEM_DEFAULT")
          Process.kill(sig, Process.pid)
          return nil
        end
        list = (@early ||= [])
        list << command if list.size < EARLY_MAX
        nil
      end

      # The commands kept for this worker; from here on it is a worker with
      # handlers of its own, and a child it forks is not one (#early_push).
      def take_early
        @worker_fork = false
        list = @early || []
        @early = []
        list
      end
    end

    def initialize
      @pid = Process.pid
      @reader, @writer = IO.pipe
      @old = {}
      @buffer = +""
    end

    def install(table)
      table.each do |sig, command|
        next unless Signal.list.key?(sig)

        @old[sig] = if sig == "TERM"
                      Signal.trap(sig) do
                        Signals.term_received = true
                        push(command)
                      end
                    else
                      Signal.trap(sig) { push(command) }
                    end
      end
      self
    end

    # Safe from trap handlers and any thread; never blocks. In a forked
    # child it never reaches the parent's pipe (Signals.early_push).
    def push(command)
      return Signals.early_push(command) unless Process.pid == @pid

      @writer.write_nonblock("#{command}\n", exception: false)
    rescue IOError, SystemCallError
      nil
    end

    # Commands received within timeout seconds (nil: wait forever); [] when none.
    def wait(timeout)
      return [] unless @reader.wait_readable(timeout)

      read
    end

    # Commands already in the pipe, without waiting.
    def read
      chunk = @reader.read_nonblock(4096, exception: false)
      @buffer << chunk if chunk.is_a?(String)
      names = []
      while (line = @buffer.slice!(/\A[^\n]*\n/))
        name = line.chomp.to_sym
        names << name if Commands::QUEUEABLE.include?(name)
      end
      names
    rescue IOError
      []
    end

    # Takes the commands Signals.take_early kept (signals that reached this
    # process before #install) that the table's process acts on.
    def replay_early(accepted)
      Signals.take_early.each { |command| push(command) if accepted.include?(command) }
    end

    # In a forked child: closes the parent's pipe and leaves its handlers in
    # place (they keep what they get for the child, #push) until the
    # child's own #install replaces them; no moment of default handlers.
    def detach
      [@reader, @writer].each { |io| io.close unless io.closed? }
    end

    def restore
      @old.each { |sig, old| Signal.trap(sig, old || "DEFAULT") }
      @old.clear
    end

    def close
      restore
      detach
    end
  end
end
