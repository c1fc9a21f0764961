# frozen_string_literal: true

require "json"
require "serval/cluster/command_channel"
require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # The master's view of one worker process: its status pipe and command
    # channel (CommandChannel), its last check-in (on the monotonic clock, for
    # deadlines; wall clock for stats) and the Server#stats it sent with it.
    class WorkerHandle
      attr_reader :pid, :index, :phase, :spawned_at, :booted_at, :last_checkin_at, :last_status, :status_io, :control_io,
                  :replies, :generation
      attr_accessor :exit_status, :stop_sent_at, :mold # mold: this worker became the mold (Mold)

      # generation: the refork it was forked from (0: forked by the master)
      def initialize(pid:, index:, phase:, status_io:, control_io:, now:, generation: 0)
        @pid = pid
        @generation = generation
        @index = index
        @phase = phase
        @status_io = status_io
        @control_io = control_io
        @replies = CommandChannel::Reader.new(control_io) # read by CommandChannel::Asker
        @spawned_at = now
        @started_at = Time.now.utc
        @booted_at = nil
        @last_checkin_at = now
        @last_checkin_wall = nil
        @last_status = {}
        @buffer = +""
      end

      def booted?
        !@booted_at.nil?
      end

      def stopping?
        !@stop_sent_at.nil?
      end

      # Reads what the worker wrote. Returns :booted on its first booted
      # check-in, :eof when the pipe closed, else nil.
      def read(now)
        chunk = @status_io.read_nonblock(65_536, exception: false)
        return :eof if chunk.nil?
        return nil if chunk == :wait_readable

        @buffer << chunk
        event = nil
        while (line = @buffer.slice!(/\A[^\n]*\n/))
          event = :booted if checkin(line, now) == :booted
        end
        event
      rescue IOError, SystemCallError
        :eof
      end

      # The deadline the master enforces: boot within worker_boot_timeout,
      # then check in at least every worker_timeout seconds.
      def deadline(options)
        booted? ? @last_checkin_at + options[:worker_timeout] : @spawned_at + options[:worker_boot_timeout]
      end

      # Suspend/resume guard: the master itself did not run for `gap` seconds,
      # so the silence is not the worker's fault.
      def excuse(gap)
        @last_checkin_at += gap
        @spawned_at += gap
      end

      def signal(sig)
        Process.kill(sig, @pid)
        true
      rescue Errno::ESRCH
        false
      end

      def close
        [@status_io, @control_io].each { |io| io.close unless io.closed? }
      end

      def stats
        { started_at: @started_at.strftime("%Y-%m-%dT%H:%M:%SZ"), pid: @pid, index: @index, phase: @phase, generation: @generation,
          booted: booted?, last_checkin: @last_checkin_wall&.strftime("%Y-%m-%dT%H:%M:%SZ"),
          last_status: @last_status }
      end

      private

      def checkin(line, now)
        message = JSON.parse(line, symbolize_names: true)
        @last_checkin_at = now
        @last_checkin_wall = Time.now.utc
        @last_status = message[:status] || {}
        return nil if booted? || !message[:booted]

        @booted_at = now
        :booted
      rescue JSON::ParserError
        nil
      end
    end
  end
end
