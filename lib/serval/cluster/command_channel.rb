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
    # check-ins) go on while it records. The master waits for the answers up
    # to a deadline and reports the workers that did not answer; a late answer
    # is read and dropped by the next request (its id is not the current one).
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

      # The master's side; one request at a time (the control app has one thread).
      class Asker
        def initialize
          @lock = Mutex.new
          @id = 0
        end

        # handles: WorkerHandles to ask. Returns [answers, missing]:
        # answers [{index:, pid:, result:}] (plus payload: when the answer
        # had one), missing [{index:, pid:, error:}], in the order of handles.
        def ask(handles, command, timeout, **args)
          @lock.synchronize do
            id = (@id += 1)
            line = "#{JSON.generate(args.merge(id: id, command: command))}\n"
            missing = {}
            pending = {}
            handles.each do |h|
              if h.control_io.write_nonblock(line, exception: false) == line.bytesize
                pending[h.control_io] = h
              else
                missing[h] = "its command channel is full" # it has not read for a long while
              end
            rescue IOError, SystemCallError => e
              missing[h] = "not reachable (#{e.class.name.split('::').last})"
            end
            answers = collect(pending, id, now + timeout, missing)
            pending.each_value { |h| missing[h] ||= "no answer within #{timeout.round(1)}s" }
            [handles.filter_map { |h| entry(h, **answers[h].slice(:result, :payload)) if answers.key?(h) },
             handles.filter_map { |h| entry(h, error: missing[h]) if missing.key?(h) }]
          end
        end

        private

        # Reads until every pending handle answered (or failed) or the
        # deadline passed; answered handles leave `pending`.
        def collect(pending, id, deadline, missing)
          answers = {}
          until pending.empty?
            left = deadline - now
            break if left <= 0

            ready = wait_readable(pending, missing, left)
            ready.each do |io|
              handle = pending[io]
              reply = handle.replies.read(id)
              next unless reply

              pending.delete(io)
              if reply == :eof then missing[handle] = "exited before answering"
              elsif reply.key?(:error) then missing[handle] = reply[:error].to_s
              else answers[handle] = reply
              end
            end
          end
          answers
        end

        def wait_readable(pending, missing, timeout)
          ready, = IO.select(pending.keys, nil, nil, timeout)
          ready || []
        rescue IOError # the supervisor closed a reaped worker's channel meanwhile
          pending.select { |io, _| io.closed? }.each do |io, handle|
            pending.delete(io)
            missing[handle] = "exited before answering"
          end
          []
        end

        def entry(handle, **rest)
          { index: handle.index, pid: handle.pid, **rest }
        end

        def now
          Process.clock_gettime(Process::CLOCK_MONOTONIC)
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
