# frozen_string_literal: true

require "serval/supervisor"
require "serval/cluster/mold"

module Serval
  class Cluster < Supervisor
    # The master's side of refork (fork_worker, Mold): when the lowest-index
    # worker has served fork_worker requests (once) or on the refork command, it asks
    # the lowest-index worker to become the mold, then replaces every worker
    # forked before it, one at a time, through the recycling path (the
    # replacement, forked from the mold, boots first; then the old one
    # drains). Every worker spawned while a mold is ready (a crash's
    # respawn, TTIN, recycling) forks from it. A phased restart ends the
    # mold: its workers then fork from the master, as before any refork.
    #
    # Mixed into Cluster; its state: @mold (the mold's WorkerHandle or nil),
    # @generation (of the newest mold; a WorkerHandle forked from it carries
    # it), @reforks (count).
    module Refork
      SPAWN_TIMEOUT = 10.0 # seconds for the mold to fork a worker

      private

      def refork_setup
        @mold = nil
        @generation = 0
        @reforks = 0
        @refork_after = @options[:fork_worker]
        return unless @refork_after

        return if Mold.subreaper!

        @log_writer.error("serval: fork_worker needs Linux (a child subreaper); workers fork from the master")
        @refork_after = nil
      end

      def refork_stats
        return {} unless @refork_after

        { reforks: @reforks, mold: @mold && { pid: @mold.pid, ready: mold_ready?, generation: @generation,
                                              forked: @mold.last_status[:forked], pss_mb: @mold.last_status[:pss_mb] } }
      end

      def mold_ready? = @mold&.last_status&.dig(:mold) == "ready"
      def mold_pending? = !@mold.nil? && !mold_ready?

      def on_refork
        return @log_writer.info("- refork needs fork_worker; ignored") unless @refork_after

        @refork_wanted = "refork command"
      end

      # From maintain: the automatic refork (once), a pending one, then the
      # replacement of workers older than the mold.
      def step_refork
        return unless @refork_after && !@stopping

        check_mold_deadline
        first = @workers.values.min_by(&:index)
        if !@auto_reforked && @refork_after.positive? && first&.booted? &&
           first.last_status[:requests_count].to_i >= @refork_after
          @auto_reforked = true
          @refork_wanted ||= "worker #{first.index} served #{first.last_status[:requests_count]} requests >= #{@refork_after}"
        end
        start_refork if @refork_wanted && settled?
        replace_older_than_mold
      end

      def settled?
        @retiring.empty? && @replacing.empty? && !mold_pending? &&
          @workers.size == @wanted && @workers.values.all?(&:booted?)
      end

      def start_refork
        why = @refork_wanted
        @refork_wanted = nil
        handle = @workers.values.min_by(&:index)
        return unless handle

        old = @mold
        @generation += 1
        @reforks += 1
        @log_writer.info("- Refork #{@generation} (#{why}): worker #{handle.index} (PID: #{handle.pid}) becomes the mold")
        line = "#{JSON.generate(id: 0, command: 'mold')}\n"
        unless handle.control_io.write_nonblock(line, exception: false) == line.bytesize
          return @log_writer.error("! Refork: worker #{handle.index} could not be asked; refork skipped")
        end

        @workers.delete(handle.index)
        handle.mold = true
        @mold = handle
        @mold_deadline = now + @options[:drain_timeout] + @options[:worker_boot_timeout]
        if old
          @log_writer.info("- Stopping the previous mold (PID: #{old.pid})")
          old.stop_sent_at = now
          @retiring << old
          old.signal("TERM")
        end
      end

      # A worker that does not become the mold within drain_timeout +
      # worker_boot_timeout is killed; its index is forked by the master.
      def check_mold_deadline
        return unless mold_pending? && now > @mold_deadline

        @log_writer.error("! Worker #{@mold.index} (PID: #{@mold.pid}) did not become the mold within " \
                          "#{(@options[:drain_timeout] + @options[:worker_boot_timeout]).round(1)}s; killing it")
        @mold.stop_sent_at = now
        @mold.signal("KILL")
        @retiring << @mold
        @mold = nil
      end

      def replace_older_than_mold
        return unless mold_ready? && settled?

        old = @workers.values.sort_by(&:index).find { |h| h.generation < @generation }
        return unless old

        @log_writer.info("- Worker #{old.index} (PID: #{old.pid}) replaced by a fork of the mold")
        @replacing[old.index] = @workers.delete(old.index)
        spawn_worker(old.index)
      end

      # The pid of a worker the mold forked with these ends of its channels,
      # or nil (no mold, or it failed: the master forks it itself).
      def fork_from_mold(index, ios)
        return nil unless mold_ready?

        @mold_request = (@mold_request || 0) + 1
        Mold.request_spawn(@mold.control_io, @mold.replies, @mold_request, index: index, phase: @phase, ios: ios,
                                                                           timeout: SPAWN_TIMEOUT)
      rescue IOError, SystemCallError, ArgumentError, TypeError => e
        @log_writer.error("! The mold (PID: #{@mold.pid}) could not fork worker #{index} (#{e.message}); stopping it, " \
                          "workers fork from the master")
        end_mold
        nil
      end

      # The mold exited (reap) or is no longer wanted.
      def end_mold(reaped: false)
        return unless @mold

        unless reaped
          @mold.stop_sent_at = now
          @retiring << @mold
          @mold.signal("TERM")
        end
        @mold = nil
      end

      # true when the reaped handle was a mold (the current one or one retired).
      def mold_exited(handle)
        return false unless handle.mold

        what = handle.stopping? ? "stopped" : "exited"
        @log_writer.info("- The mold (PID: #{handle.pid}) #{what} (#{describe(handle.exit_status)})")
        @mold = nil if @mold.equal?(handle)
        true
      end
    end
  end
end
