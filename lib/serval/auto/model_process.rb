# frozen_string_literal: true

require "monitor"
require "rbconfig"
require "serval/errors"

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
    # on stdin and answers each with a frame holding the result or nil; it
    # exits at EOF, so it ends with the process that started it. Any failure
    # raises ModelProcessError and stops the child; the next call starts a
    # new one. Calls from several threads take turns (one child, one pipe).
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

      def priority = PRIORITIES.key(@priority)

      # For the next child (the current one, if any, keeps its own).
      def priority=(name)
        @priority = PRIORITIES.fetch(name) { raise ArgumentError, "priority is :idle or :batch" }
      end

      def initialize(timeout: TIMEOUT, priority: :idle)
        @timeout = timeout
        @priority = PRIORITIES.fetch(priority) { raise ArgumentError, "priority is :idle or :batch" }
        @pid = nil
        @lock = Monitor.new
      end

      # The model for window (Model.call's arguments).
      def call(window, **options) = ask(:model, window, options)

      # Serval::Advice.recommend(window, **options) (the machine's facts
      # given in options[:machine]: the child reads none of its own).
      def advice(window, **options) = ask(:advice, window, options)

      # Kills the child first, so that a call in progress in another thread
      # ends at once (its read fails) instead of holding the lock.
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
          start unless @pid
          write_frame(Marshal.dump([kind, window, options]))
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

      def stop_child
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
        @pid = Process.spawn(RbConfig.ruby, "-I", LIB, CHILD, nice.to_s, policy, in: child_in, out: child_out,
                                                                                  err: :err, close_others: true)
        child_in.close
        child_out.close
        @to.binmode
        @from.binmode
      rescue SystemCallError => e
        raise ModelProcessError, "model process did not start: #{e.message}"
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
