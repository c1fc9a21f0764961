# frozen_string_literal: true

require "serval/supervisor"

module Serval
  class Cluster < Supervisor
    # The workers' load, shared: an unlinked file the master opens before the
    # first fork, one fixed-size slot per worker index. Each worker's
    # Balancer writes its own slot every Balancer::TICK (pwrite, one system
    # call) and reads the others' (pread); the master reads every slot for
    # its capacity signal (Capacity: agent-check, /ready). No lock: a slot is
    # written by one process, and a reader that catches a write half done sees
    # the two copies of the stamp differ and skips the slot for that read.
    #
    # A slot (little-endian, SLOT bytes):
    #   stamp   u64  CLOCK_MONOTONIC ns of the write (one clock for all processes)
    #   pid     u32
    #   flags   u32  HOLD | SHEDDING | STOPPING
    #   util    f64  share of the window some thread held the GVL (0..1)
    #   busy    f64  threads running a request, averaged over the window
    #   max     u32  max_threads
    #   conns   u32  open connections
    #   moved   u64  keep-alive connections ended to move their clients
    #   stamp   u64  again
    class LoadTable
      SLOT = 64
      FORMAT = "Q<L<L<EEL<L<Q<Q<"
      HOLD = 1
      SHEDDING = 2
      STOPPING = 4
      MAX_SLOTS = 4096 # Configuration RULES: workers <= 4096

      Entry = Struct.new(:index, :pid, :stamp, :hold, :shedding, :stopping, :util, :busy, :max_threads,
                         :connections, :moved, keyword_init: true) do
        # Seconds since the worker wrote it.
        def age(now_ns = LoadTable.now_ns)
          (now_ns - stamp) / 1e9
        end

        # What this worker can still take, 0..1: the smaller of its GVL
        # headroom and its free threads.
        def headroom
          require "serval/capacity"
          Capacity.headroom(util, busy, max_threads)
        end
      end

      def self.now_ns
        Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
      end

      # dir: where the (at once unlinked) file lives; tmpfs or disk, it is
      # a few hundred bytes and stays in the page cache.
      def self.create(dir)
        io = begin
          File.open(dir, File::RDWR | File::TMPFILE, 0o600)
        rescue SystemCallError, NameError # no O_TMPFILE here (filesystem or platform)
          path = File.join(dir, "serval-load-#{Process.pid}-#{rand(1 << 32)}")
          File.open(path, File::RDWR | File::CREAT | File::EXCL, 0o600).tap { File.unlink(path) }
        end
        new(io)
      end

      def initialize(io)
        @io = io
        @io.binmode
      end

      def write(index, pid:, util:, busy:, max_threads:, connections:, moved:, hold: false, shedding: false,
                stopping: false)
        raise ArgumentError, "worker index #{index} out of range" unless index.between?(0, MAX_SLOTS - 1)

        stamp = self.class.now_ns
        flags = (hold ? HOLD : 0) | (shedding ? SHEDDING : 0) | (stopping ? STOPPING : 0)
        record = [stamp, pid, flags, util.to_f, busy.to_f, max_threads, connections, moved, stamp].pack(FORMAT)
        @io.pwrite(record.ljust(SLOT, "\0"), index * SLOT)
      end

      # Entries written within max_age seconds (all when nil), by index.
      def read(max_age: nil)
        data = @io.pread(@io.size, 0)
        now = self.class.now_ns
        (data.bytesize / SLOT).times.filter_map do |i|
          entry = decode(i, data.byteslice(i * SLOT, SLOT))
          entry if entry && (max_age.nil? || entry.age(now) <= max_age)
        end
      rescue IOError, SystemCallError
        []
      end

      def close
        @io.close unless @io.closed?
      end

      def closed?
        @io.closed?
      end

      private

      def decode(index, bytes)
        stamp, pid, flags, util, busy, max, conns, moved, again = bytes.unpack(FORMAT)
        return nil if stamp.nil? || stamp.zero? || stamp != again

        Entry.new(index: index, pid: pid, stamp: stamp, hold: flags.anybits?(HOLD), shedding: flags.anybits?(SHEDDING),
                  stopping: flags.anybits?(STOPPING), util: util, busy: busy, max_threads: max,
                  connections: conns, moved: moved)
      end
    end
  end
end
