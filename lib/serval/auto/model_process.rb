# frozen_string_literal: true

require "monitor"
require "rbconfig"
require "tmpdir"
require "serval/errors"
require "serval/auto/sample_table"

module Serval
  module Auto
    # Runs Auto::Model in a child process at the lowest CPU priority (nice
    # 19), so that its burst of Ruby does not take the GVL from the request
    # threads: in the process a model run (0.2-0.3 s of CPU at 16 counts) is
    # a thread that request threads wait behind, and at 80 % load one run in
    # a 15 s measurement tripled p99 (bench/NOTES.md "threads :auto (issue 10)").
    # In a child it has its own GVL, and the kernel gives it the CPU the
    # server leaves idle (on Linux the child's model thread also takes the
    # idle scheduling policy, so a waking request thread does not wait for
    # the end of its slice: model_child.rb).
    #
    # The advice (Serval::Advice.recommend: the advice log's check and the
    # control app's /advice, 0.4 s and 2-3 s of CPU) runs there for the same
    # reason (#advice): in the serving process each check held requests
    # back for as long.
    #
    # The child (lib/serval/auto/model_child.rb, a plain `ruby` started with
    # Process.spawn, not a fork of the server: it loads only the model, none
    # of the app) reads length-prefixed Marshal frames [kind, window, options]
    # on stdin (the window's samples packed by column: SampleTable, a third of
    # Marshal's time) and answers each with a frame holding the result or nil; it
    # exits at EOF, so it ends with the process that started it. Any failure
    # raises ModelProcessError and stops the child; the next call starts a
    # new one. Calls from several threads take turns (one child, one pipe).
    #
    # #submit is the same request without waiting (the advice log's check,
    # from the supervising loop, which must not block): the frame goes to a
    # file of its own (0600, in Dir.tmpdir) and the pipe carries only
    # [:file, path], a few bytes that never fill it, however long the child
    # (nice 19, SCHED_IDLE) takes to read. The caller waits for
    # Request#io to be readable and calls Request#poll, which reads what
    # arrived and gives the answer once it is whole, or raises (the child
    # failed, or gave no answer within the timeout: the child is then
    # stopped, as with #call). A submitted request holds the child's turn
    # until it ends: a blocking call from another thread waits for it, and a
    # #submit while the child is busy returns nil at once.
    #
    # priority: :idle (nice 19 and SCHED_IDLE, above: checks nobody waits
    # for) or :batch (nice 0 and SCHED_BATCH: the control app's /advice,
    # which someone waits for; a fair share of a busy CPU, about a second
    # of it per advice, without preempting a request thread that wakes).
    class ModelProcess
      NICE = 19
      PRIORITIES = { idle: [NICE, "idle"], batch: [0, "batch"] }.freeze
      TIMEOUT = 30.0 # seconds for one answer (a model run takes well under one)
      CHILD = File.expand_path("model_child.rb", __dir__)
      LIB = File.expand_path("../..", __dir__)
      MAX_FRAME = 64 << 20

      attr_reader :pid

      # Seconds for one answer; a new value holds from the next call on.
      attr_accessor :timeout

      def priority = PRIORITIES.key(@priority)

      # For the next child (the current one, if any, keeps its own).
      def priority=(name)
        @priority = PRIORITIES.fetch(name) { raise ArgumentError, "priority is :idle or :batch" }
      end

      # child: the script the child runs (tests give one of their own).
      def initialize(timeout: TIMEOUT, priority: :idle, child: CHILD)
        @timeout = timeout
        @priority = PRIORITIES.fetch(priority) { raise ArgumentError, "priority is :idle or :batch" }
        @child = child
        @pid = nil
        @lock = Monitor.new
        @turn = @lock.new_cond
        @request = nil # the submitted Request that holds the child's turn
      end

      # A submitted request (#submit): wait for #io to be readable (EOF
      # included), then #poll. #deadline is when it times out (monotonic
      # seconds); #poll enforces it, whenever it is called.
      class Request
        PENDING = :pending

        attr_reader :io, :deadline

        def initialize(owner, io, deadline, path)
          @owner = owner
          @io = io
          @deadline = deadline
          @path = path
          @buffer = "".b
          @done = false
        end

        def done? = @done

        # PENDING until the answer is whole; then the answer (nil included:
        # as #call), once. Raises ModelProcessError (the child is stopped) when
        # the child failed or ended, ModelProcessTimeout past the deadline.
        def poll(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
          raise ModelProcessError, "model process: the request has ended" if @done

          answer = @owner.send(:poll_request, self, now)
          return PENDING if answer.equal?(PENDING)

          answer
        end

        # Ends it: the child is stopped (it may be busy with it for a while).
        def cancel
          @owner.send(:end_request, self, stop: true) unless @done
        end

        # For ModelProcess: the bytes read so far, and the end.
        def buffer = @buffer

        def finish
          @done = true
          File.unlink(@path) if @path
        rescue SystemCallError
          nil
        end
      end

      # The model for window (Model.call's arguments).
      def call(window, **options) = ask(:model, window, options)

      # Serval::Advice.recommend(window, **options) (the machine's facts
      # given in options[:machine]: the child reads none of its own).
      def advice(window, **options) = ask(:advice, window, options)

      # Kinds of request: :model (#call), :advice (#advice), :local_advice
      # (Serval::Advice::Local.recommend(window, **options) in the child:
      # the machine's facts read there, the same machine and cgroup, and the
      # workers' memory from options[:pids], the serving processes' pids;
      # what the advice log submits, so the loop reads none of them).
      KINDS = %i[model advice local_advice].freeze

      # Starts Serval::Advice.recommend(window, **options) (kind :advice) or
      # the model (kind :model) in the child without waiting for it: a
      # Request, or nil when the child is busy with another call. Raises
      # ModelProcessError when the child cannot start or take the request.
      def submit(kind, window, **options)
        raise ArgumentError, "unknown kind #{kind.inspect}" unless KINDS.include?(kind)
        return nil unless @lock.try_enter

        begin
          return nil if @request

          begin
            start unless @pid
            path = write_file(Marshal.dump([kind, SampleTable.pack(window), options]))
            frame = Marshal.dump([:file, path])
            data = [frame.bytesize].pack("N") + frame
            # an idle child has read every frame: the pipe is empty and takes these few bytes at once
            raise ModelProcessError, "model process: its pipe is full" unless @to.write_nonblock(data, exception: false) == data.bytesize

            @request = Request.new(self, @from, Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout, path)
          rescue ModelProcessError
            unlink(path)
            stop_child
            raise
          rescue SystemCallError, IOError, TypeError, ArgumentError => e
            unlink(path)
            stop_child
            raise ModelProcessError, "model process: #{e.class}: #{e.message}"
          end
        ensure
          @lock.exit
        end
      end

      # Starts the child now unless it runs (the control app, ahead of the
      # first /advice: ControlApp#prepare_advice). Raises ModelProcessError.
      def prestart
        @lock.synchronize { start unless @pid }
        self
      end

      # In a process forked from the one that started the child: the pipes
      # are the parent's, so they are closed here (or the child would not
      # see its EOF when the parent ends) and the child is left alone.
      def forget
        [@to, @from].each do |io|
          io&.close
        rescue IOError
          nil
        end
        @to = @from = @pid = @request = nil
        @lock = Monitor.new # another thread may have held it at the fork
        @turn = @lock.new_cond
      end

      # Kills the child first, so that a call in progress in another thread
      # ends at once (its read fails) instead of holding the lock, and a
      # submitted request ends with it (its #poll raises).
      def stop
        pid = @pid
        begin
          Process.kill(:KILL, pid) if pid
        rescue SystemCallError
          nil
        end
        @lock.synchronize { stop_child }
      end

      private

      def ask(kind, window, options)
        @lock.synchronize do
          @turn.wait_while { @request } # a submitted request holds the child
          start unless @pid
          write_frame(Marshal.dump([kind, SampleTable.pack(window), options]))
          answer = Marshal.load(read_frame) # rubocop:disable Security/MarshalLoad -- our own child's answer
          raise ModelProcessError, answer[:error] if answer.is_a?(Hash) && answer[:error]

          answer
        rescue ModelProcessError
          stop_child
          raise
        rescue SystemCallError, IOError, TypeError, ArgumentError, EOFError => e
          stop_child
          raise ModelProcessError, "model process: #{e.class}: #{e.message}"
        end
      end

      # Request#poll: what arrived, without waiting.
      def poll_request(request, now)
        @lock.synchronize do
          raise ModelProcessError, "model process: stopped" unless request.equal?(@request)

          begin
            loop do
              chunk = @from.read_nonblock(1 << 16, exception: false)
              raise EOFError, "the model process ended" if chunk.nil?
              break if chunk == :wait_readable

              request.buffer << chunk
            end
            answer = whole_answer(request.buffer)
            if answer.equal?(Request::PENDING)
              raise ModelProcessTimeout, "model process: no answer in #{@timeout} s" if now >= request.deadline

              return answer
            end
            end_request(request)
            raise ModelProcessError, answer[:error] if answer.is_a?(Hash) && answer[:error]

            answer
          rescue ModelProcessError
            end_request(request, stop: true) if request.equal?(@request)
            raise
          rescue SystemCallError, IOError, TypeError, ArgumentError, EOFError => e
            end_request(request, stop: true)
            raise ModelProcessError, "model process: #{e.class}: #{e.message}"
          end
        end
      end

      # The answer in buffer once it is whole (the child writes nothing else).
      def whole_answer(buffer)
        return Request::PENDING if buffer.bytesize < 4

        size = buffer.unpack1("N")
        raise ModelProcessError, "model process: a #{size}-byte answer" if size > MAX_FRAME
        return Request::PENDING if buffer.bytesize < 4 + size
        raise ModelProcessError, "model process: more than one answer" if buffer.bytesize > 4 + size

        Marshal.load(buffer.byteslice(4, size)) # rubocop:disable Security/MarshalLoad -- our own child's answer
      end

      # The request ends (answered, failed or given up): the child's turn is free.
      def end_request(request, stop: false)
        @lock.synchronize do
          return unless request.equal?(@request)

          stop_child if stop
          @request = nil
          request.finish
          @turn.broadcast
        end
      end

      # The request's frame, in a new file only this user can read.
      def write_file(data)
        path = File.join(Dir.tmpdir, "serval-model-#{Process.pid}-#{object_id}-#{rand(1 << 32)}.bin")
        # binmode: File::BINARY is no binmode on Linux, and under Rails
        # (Encoding.default_internal = UTF-8) a text-mode write transcodes
        # the Marshal bytes and fails on the first byte above 0x7f
        File.open(path, File::WRONLY | File::CREAT | File::EXCL, 0o600, binmode: true) { |f| f.write(data) }
        path
      rescue SystemCallError => e
        unlink(path)
        raise ModelProcessError, "model process: cannot write the request (#{e.message})"
      end

      def unlink(path)
        File.unlink(path) if path
      rescue SystemCallError
        nil
      end

      def stop_child
        if @request # a submitted request ends with the child
          request = @request
          @request = nil
          request.finish
          @turn.broadcast
        end
        [@to, @from].each { |io| io&.close unless io&.closed? }
        @to = @from = nil
        pid = @pid
        @pid = nil
        return unless pid

        Process.kill(:KILL, pid)
        Process.wait(pid)
      rescue SystemCallError
        nil
      end

      def start
        child_in, @to = IO.pipe
        @from, child_out = IO.pipe
        nice, policy = @priority
        @pid = Process.spawn(RbConfig.ruby, "-I", LIB, @child, nice.to_s, policy, in: child_in, out: child_out,
                                                                                  err: :err, close_others: true)
        niced(@pid, nice)
        child_in.close
        child_out.close
        @to.binmode
        @from.binmode
      rescue SystemCallError => e
        raise ModelProcessError, "model process did not start: #{e.message}"
      end

      # The child's nice value set from here at once, so that its Ruby boots
      # and loads the model at it too (the child sets it again itself): at
      # nice 0 that boot took a share of a busy server's CPU at every start.
      def niced(pid, nice)
        Process.setpriority(Process::PRIO_PROCESS, pid, nice) if nice.positive?
      rescue SystemCallError
        nil # not allowed: the child tries itself
      end

      def write_frame(data)
        @to.write([data.bytesize].pack("N"), data)
        @to.flush
      end

      def read_frame
        size = read_exactly(4).unpack1("N")
        raise ModelProcessError, "model process: a #{size}-byte answer" if size > MAX_FRAME

        read_exactly(size)
      end

      def read_exactly(n)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout
        buf = +""
        while buf.bytesize < n
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise ModelProcessTimeout, "model process: no answer in #{@timeout} s" if left <= 0 || !@from.wait_readable(left)

          buf << @from.readpartial(n - buf.bytesize)
        end
        buf
      end
    end
  end
end
