# frozen_string_literal: true

require "json"
require "socket"
require "serval/threads"
require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # Requests from the master that a worker answers (a GVL trace, thread
    # backtraces), on one UNIX stream socket pair per worker. The pair is also
    # the worker's sign of life of the master: EOF on the worker's end means
    # the master is gone. Check-ins stay on the status pipe, so a large answer
    # never delays or splits one.
    #
    # Each direction carries one JSON object per line:
    #   master -> worker  {"id":7,"command":"trace","seconds":2.0,"origin_ns":...}
    #   worker -> master  {"id":7,"result":...}   or   {"id":7,"error":"..."}
    # A bulky answer (a trace's events) follows its header as one more line,
    # JSON text the master passes on without parsing:
    #   worker -> master  {"id":7,"result":{...},"payload":true}\n[...]\n
    # The worker answers on a thread of its own, so its supervise loop (and its
    # check-ins) go on while it records. The master collects the answers up
    # to a deadline, waiting for them (Asker#ask, the control app's thread)
    # or from its loop (Asker#start), and reports the workers that did not
    # answer; a late answer is read and dropped by the next request (its id
    # is not the current one).
    module CommandChannel
      # Seconds a worker gets beyond the work itself (rendering and sending
      # its answer); below servalctl's read timeout, so a stuck worker yields
      # a partial answer rather than a client timeout.
      GRACE = 10.0
      CHUNK = 1 << 20

      module_function

      # A handler's answer with a payload: JSON text without newlines.
      Bulk = Struct.new(:result, :payload)

      # [master's end, worker's end]
      def pair
        UNIXSocket.pair(:STREAM)
      end

      # The master's reading side of one channel: complete replies out of
      # the bytes as they arrive (a partial reply waits for the next read).
      class Reader
        def initialize(io)
          @io = io
          @buffer = "".b
          @header = nil # a header whose payload line is still to come
        end

        # The reply to `id` once complete (with :payload when it has one),
        # :eof, or nil (not yet). Replies to other ids are dropped.
        def read(id)
          chunk = @io.read_nonblock(CHUNK, exception: false)
          return :eof if chunk.nil?
          return nil if chunk == :wait_readable

          from = @buffer.bytesize # only the new bytes are searched
          @buffer << chunk
          found = nil
          while (newline = @buffer.index("\n", from))
            reply = take(@buffer.slice!(0, newline + 1).chomp)
            found = reply if reply && reply[:id] == id
            from = 0
          end
          found
        rescue IOError, SystemCallError
          :eof
        end

        private

        def take(line)
          if @header
            header = @header
            @header = nil
            return header.merge(payload: line)
          end
          message = JSON.parse(line, symbolize_names: true)
          return nil unless message.is_a?(Hash)
          return message unless message[:payload] == true

          @header = message
          nil
        rescue JSON::ParserError
          nil
        end
      end

      # The master's side; one request at a time on the channels: a
      # waiting one (#ask, the control app's thread) or one from the
      # supervise loop that never waits (#start: an Asking). Each waits for
      # the other to end: #start finds the channels busy and returns nil; #ask
      # waits for them (an Asking ends by its deadline) within its timeout,
      # and gets at least MIN_TIME to ask once they are free.
      class Asker
        MIN_TIME = 2.0

        def initialize
          @lock = Mutex.new
          @free = ConditionVariable.new
          @busy = false
          @id = 0
        end

        # handles: WorkerHandles to ask. Returns [answers, missing]:
        # answers [{index:, pid:, result:}] (plus payload: when the answer
        # had one), missing [{index:, pid:, error:}], in the order of handles.
        def ask(handles, command, timeout, **args)
          deadline = now + timeout
          got = acquire(deadline) or return busy(handles)

          deadline = [deadline, now + MIN_TIME].max if got == :waited
          asking = begin
            Asking.new(self, handles, next_id, command, deadline, **args)
          rescue StandardError
            release
            raise
          end
          begin
            asking.read_until_done
            asking.result
          ensure
            asking.cancel # frees the channels once: by now another ask may hold them
          end
        end

        # The same ask without waiting: an Asking (watch its #ios, #read each
        # one readable, and take its #result once #done?), or nil when
        # another ask holds the channels. From one thread (the loop's).
        def start(handles, command, timeout, **args)
          @lock.synchronize do
            return nil if @busy

            @busy = true
          end
          Asking.new(self, handles, next_id, command, now + timeout, **args)
        rescue StandardError
          release
          raise
        end

        # For Asking: the channels are free for the next ask.
        def release
          @lock.synchronize do
            @busy = false
            @free.broadcast
          end
        end

        def now
          Process.clock_gettime(Process::CLOCK_MONOTONIC)
        end

        private

        # :free, :waited (for an Asking to end), or false (still busy at the deadline).
        def acquire(deadline)
          @lock.synchronize do
            got = :free
            while @busy
              left = deadline - now
              return false if left <= 0

              got = :waited
              @free.wait(@lock, left)
            end
            @busy = true
            got
          end
        end

        def next_id
          @lock.synchronize { @id += 1 }
        end

        def busy(handles)
          [[], handles.map { |h| { index: h.index, pid: h.pid, error: "the command channels stayed busy" } }]
        end
      end

      # One ask in progress: the request written to every handle's channel
      # at once, the answers read as they arrive (#read, one channel at a
      # time, never waiting) until each handle answered or failed or the
      # deadline passed. #result (or #cancel) ends it and frees the Asker.
      class Asking
        attr_reader :deadline

        def initialize(asker, handles, id, command, deadline, **args)
          @asker = asker
          @handles = handles
          @id = id
          @deadline = deadline
          @missing = {}
          @answers = {}
          @pending = {}
          @ended = false
          write("#{JSON.generate(args.merge(id: id, command: command))}\n")
        end

        # The channels still to answer.
        def ios = @pending.keys

        # Reads what arrived on io (readable, or EOF); true once done.
        def read(io)
          take(io)
          done?
        end

        # Every handle answered or failed, the deadline passed, or it ended.
        def done?(now = @asker.now)
          @pending.keys.each { |io| take(io) if io.closed? } # a reaped worker's channel, closed by the loop
          @ended || @pending.empty? || now >= @deadline
        end

        def ended? = @ended

        # A block called when it ends (#result or #cancel).
        def on_end(&block)
          @on_end = block
        end

        # [answers, missing] as Asker#ask's; the handles that did not answer
        # are missing. Ends the ask.
        def result
          timeout = (@deadline - @started).round(1)
          @pending.each_value { |h| @missing[h] ||= "no answer within #{timeout}s" }
          @pending.clear
          cancel
          [@handles.filter_map { |h| entry(h, **@answers[h].slice(:result, :payload)) if @answers.key?(h) },
           @handles.filter_map { |h| entry(h, error: @missing[h]) if @missing.key?(h) }]
        end

        # Ends it (a late answer is dropped by the next ask: its id is not the next's).
        def cancel
          return if @ended

          @ended = true
          @asker.release
          @on_end&.call
        end

        # For Asker#ask: waits on the channels until done.
        def read_until_done
          until done?
            ready = wait_readable(@deadline - @asker.now)
            ready.each { |io| take(io) }
          end
        end

        private

        def take(io)
          handle = @pending[io] or return
          reply = io.closed? ? :eof : handle.replies.read(@id)
          return unless reply

          @pending.delete(io)
          if reply == :eof then @missing[handle] = "exited before answering"
          elsif reply.key?(:error) then @missing[handle] = reply[:error].to_s
          else @answers[handle] = reply
          end
        end

        def write(line)
          @started = @asker.now
          @handles.each do |h|
            if h.control_io.write_nonblock(line, exception: false) == line.bytesize
              @pending[h.control_io] = h
            else
              @missing[h] = "its command channel is full" # it has not read for a long while
            end
          rescue IOError, SystemCallError => e
            @missing[h] = "not reachable (#{e.class.name.split('::').last})"
          end
        end

        def wait_readable(timeout)
          return [] if timeout <= 0

          ready, = IO.select(@pending.keys, nil, nil, timeout)
          ready || []
        rescue IOError # the supervisor closed a reaped worker's channel meanwhile: done? reads it as gone
          []
        end

        def entry(handle, **rest)
          { index: handle.index, pid: handle.pid, **rest }
        end
      end

      # The worker's side: reads requests in the supervise loop, answers each
      # on its own thread with handlers[command].call(request).
      class Responder
        def initialize(io, handlers, log_writer)
          @io = io
          @handlers = handlers
          @log_writer = log_writer
          @buffer = +""
          @write_lock = Mutex.new
        end

        # Reads what arrived and starts the answers; false once the master is gone.
        def read
          chunk = @io.read_nonblock(CHUNK, exception: false)
          return false if chunk.nil?
          return true if chunk == :wait_readable

          @buffer << chunk
          while (line = @buffer.slice!(/\A[^\n]*\n/))
            request = parse(line)
            Threads.spawn("serval-command", @log_writer) { answer(request) } if request
          end
          true
        rescue IOError, SystemCallError
          false
        end

        private

        def parse(line)
          request = JSON.parse(line, symbolize_names: true)
          request.is_a?(Hash) && request.key?(:id) ? request : nil
        rescue JSON::ParserError
          nil
        end

        def answer(request)
          text = reply(request)
          @write_lock.synchronize { @io.write(text) }
        rescue IOError, SystemCallError
          nil # the master is gone; the supervise loop sees the EOF
        end

        # The reply's lines, newline-terminated.
        def reply(request)
          id = request[:id]
          handler = @handlers[request[:command].to_s.to_sym]
          return "#{JSON.generate(id: id, error: "unknown command #{request[:command].inspect}")}\n" unless handler

          answer = handler.call(request)
          return "#{JSON.generate(id: id, result: answer)}\n" unless answer.is_a?(Bulk)
          raise ArgumentError, "a payload is one line" if answer.payload.include?("\n")

          "#{JSON.generate(id: id, result: answer.result, payload: true)}\n#{answer.payload}\n"
        rescue StandardError, NotImplementedError => e
          "#{JSON.generate(id: id, error: "#{e.class}: #{e.message}")}\n"
        end
      end
    end
  end
end
