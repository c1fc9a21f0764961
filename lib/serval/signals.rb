# frozen_string_literal: true

require "serval/commands"

require "io/wait"

module Serval
  # Signals and programmatic commands share one self-pipe. A trap handler only
  # writes the command's name into the pipe; the supervisor loop reads names
  # back with #wait and handles them in a single `case`.
  #
  #   signals = Serval::Signals.new
  #   signals.install(Serval::Signals::MASTER)
  #   signals.wait(5)   # => [:stop] (commands, in arrival order; [] on timeout)
  class Signals
    DUMP_SIGNAL = Commands::DUMP_SIGNAL

    # signal => command, for the process that supervises (single mode or the
    # cluster master): lib/serval/commands.rb's table, plus SIGCHLD.
    MASTER = Commands::SIGNALS.merge("CHLD" => :child).freeze

    # signal => command, in a cluster worker (the master sends TERM/INT/HUP/dump).
    WORKER = {
      "TERM" => :stop, "QUIT" => :stop, "INT" => :halt, "HUP" => :reopen_logs,
      DUMP_SIGNAL => :dump_threads, "USR1" => :ignore, "USR2" => :ignore,
      "TTIN" => :ignore, "TTOU" => :ignore, "CHLD" => :ignore
    }.freeze

    COMMANDS = %i[stop halt restart phased_restart reopen_logs add_worker remove_worker
                  dump_threads child ignore stopped].freeze

    attr_reader :reader

    def initialize
      @reader, @writer = IO.pipe
      @old = {}
      @buffer = +""
    end

    def install(table)
      table.each do |sig, command|
        next unless Signal.list.key?(sig)

        @old[sig] = Signal.trap(sig) { push(command) }
      end
      self
    end

    # Safe from trap handlers and any thread; never blocks.
    def push(command)
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
        names << name if COMMANDS.include?(name)
      end
      names
    rescue IOError
      []
    end

    def restore
      @old.each { |sig, old| Signal.trap(sig, old || "DEFAULT") }
      @old.clear
    end

    def close
      restore
      [@reader, @writer].each { |io| io.close unless io.closed? }
    end
  end
end
