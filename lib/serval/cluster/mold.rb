# frozen_string_literal: true

require "json"
require "socket"
require "serval/supervisor"
require "serval/cluster/command_channel"

module Serval
  class Cluster < Supervisor
    # Refork (fork_worker): a warmed worker stops serving and becomes the
    # mold, the process new workers are forked from, so they start with the
    # heap it built while serving (loaded code, caches, YJIT's output) shared
    # copy-on-write instead of each building its own.
    #
    # The mold keeps the worker's two channels to the master. On the command
    # channel (a UNIX socket pair) the master sends one request per new
    # worker, with the worker's ends of its status pipe and command channel
    # attached (SCM_RIGHTS):
    #   master -> mold  {"id":3,"command":"spawn","index":1,"phase":0}  + 2 descriptors
    #   mold -> master  {"id":3,"result":{"pid":4242}}
    # The mold forks twice so the worker's parent is the master (a child
    # subreaper, Mold.subreaper!), which reaps it like any worker. It checks
    # in on its status pipe like a worker ({"mold":"ready"}), reopens its
    # logs on HUP (its forks inherit them); EOF on the command channel (the
    # master is gone), TERM, QUIT or INT end it.
    class Mold
      # The listeners a worker forked from the mold serves (Worker's binder).
      Listeners = Struct.new(:listeners)

      PR_SET_CHILD_SUBREAPER = 36

      # Makes this process (the master) the parent of every orphan below it,
      # so a worker the mold forks twice is the master's child. Linux only;
      # false where it is not available.
      def self.subreaper!
        return false unless RUBY_PLATFORM.include?("linux")

        require "fiddle"
        prctl = Fiddle::Function.new(Fiddle::Handle::DEFAULT["prctl"], [Fiddle::TYPE_INT] + [Fiddle::TYPE_LONG] * 4,
                                     Fiddle::TYPE_INT)
        prctl.call(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0).zero?
      rescue LoadError, StandardError
        false
      end

      # The master's side: asks the mold (its control socket, its
      # CommandChannel::Reader) for a worker; returns its pid or raises.
      def self.request_spawn(socket, replies, id, index:, phase:, ios:, timeout:)
        line = "#{JSON.generate(id: id, command: "spawn", index: index, phase: phase)}\n"
        socket.sendmsg(line, 0, nil, Socket::AncillaryData.unix_rights(*ios))
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        loop do
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise IOError, "no answer within #{timeout}s" if left <= 0
          next unless socket.wait_readable(left)

          reply = replies.read(id)
          raise IOError, "the mold exited" if reply == :eof
          next unless reply
          raise IOError, reply[:error].to_s if reply[:error]

          return Integer(reply.dig(:result, :pid))
        end
      end

      def initialize(index:, options:, app:, listeners:, log_writer:, status_io:, control_io:, load_table:, signals:)
        @index = index
        @options = options
        @app = app
        @listeners = listeners
        @log_writer = log_writer
        @status_io = status_io
        @control_io = control_io
        @load_table = load_table
        @signals = signals
        @buffer = +""
        @fds = []
        @forked = 0
      end

      # The mold's loop; returns the exit status.
      def run
        ProcessTitle.mold(@index, @options[:tag])
        warm_up
        @log_writer.info("- Worker #{@index} (PID: #{Process.pid}) is now the mold; new workers fork from it")
        interval = @options[:worker_check_interval]
        checkin
        loop do
          ready, = IO.select([@signals.reader, @control_io], nil, nil, interval)
          if ready&.include?(@signals.reader)
            commands = @signals.read
            return 0 if (commands & %i[stop halt]).any?

            Launcher::Support.reopen_logs(@log_writer) if commands.include?(:reopen_logs) # the forks inherit them
          end
          return 0 if ready&.include?(@control_io) && !read_requests

          checkin
        end
      ensure
        @fds.each { |io| io.close unless io.closed? }
      end

      private

      # What the forks share: the garbage the serving left is collected
      # once, here, and what survives is promoted to the old generation (a
      # few full GCs), so the workers' minor GCs do not touch, and unshare,
      # those pages. Active Record's connections are closed: the workers
      # open their own (Rails discards inherited ones after a fork).
      def warm_up
        release_connections
        4.times { GC.start(full_mark: true, immediate_sweep: true) }
      end

      def release_connections
        return unless defined?(::ActiveRecord::Base) && ::ActiveRecord::Base.respond_to?(:connection_handler)

        require "serval/db_pools"
        DbPools.disconnect_all
      rescue StandardError => e
        @log_writer.error("serval: the mold could not close Active Record's connections (#{e.class}: #{e.message})")
      end

      # false at EOF (the master is gone).
      def read_requests
        data, _, _, *controls = @control_io.recvmsg(CommandChannel::CHUNK, 0, nil, scm_rights: true)
        return false if data.nil? || data.empty?

        controls.each { |c| @fds.concat(c.unix_rights || []) if c.cmsg_is?(:SOCKET, :RIGHTS) }
        @buffer << data
        while (line = @buffer.slice!(/\A[^\n]*\n/))
          request = parse(line)
          answer(request) if request
        end
        true
      rescue IOError, SystemCallError
        false
      end

      def parse(line)
        request = JSON.parse(line, symbolize_names: true)
        request.is_a?(Hash) && request[:command] == "spawn" ? request : nil # late replies to the worker's asks: dropped
      rescue JSON::ParserError
        nil
      end

      def answer(request)
        ios = @fds.shift(2)
        text = if ios.size == 2
                 JSON.generate(id: request[:id], result: { pid: spawn(Integer(request[:index]), *ios) })
               else
                 JSON.generate(id: request[:id], error: "spawn came without its two descriptors")
               end
        @control_io.write("#{text}\n")
      rescue StandardError => e
        @control_io.write("#{JSON.generate(id: request[:id], error: "#{e.class}: #{e.message}")}\n")
      ensure
        ios&.each { |io| io.close unless io.closed? }
      end

      # Forks twice: the middle process exits at once, so the worker is
      # adopted by the master (the subreaper). Returns the worker's pid.
      def spawn(index, status_w, control_w)
        @options[:before_refork].each { |hook| hook.call(index) }
        reader, writer = IO.pipe
        middle = Signals.forking_worker { Process.fork { spawn_middle(index, status_w, control_w, reader, writer) } }
        writer.close
        Process.wait(middle)
        pid = Integer(reader.read.to_s.strip)
        @forked += 1
        @options[:after_refork].each { |hook| hook.call(index) }
        pid
      ensure
        reader&.close
        writer&.close unless writer&.closed?
      end

      # The middle process: forks the worker, tells its pid, exits.
      def spawn_middle(index, status_w, control_w, reader, writer)
        reader.close
        pid = Process.fork { worker_main(index, status_w, control_w, writer) }
        writer.write("#{pid}\n")
      ensure
        Process.exit!(0)
      end

      def worker_main(index, status_w, control_w, writer)
        Worker.main([writer, @status_io, @control_io], @signals, index: index, options: @options, app: @app,
                                                                 binder: Listeners.new(@listeners), log_writer: @log_writer,
                                                                 status_io: status_w, control_io: control_w, load_table: @load_table)
      end

      def checkin
        status = { mold: "ready", forked: @forked, pss_mb: Recycler.memory_mb(Process.pid)&.first&.round(1) }
        @status_io.write_nonblock("#{JSON.generate(pid: Process.pid, index: @index, booted: true, status: status)}\n",
                                  exception: false)
      rescue IOError, SystemCallError
        nil
      end
    end
  end
end
