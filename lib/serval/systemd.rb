# frozen_string_literal: true

require "socket"

module Serval
  # systemd integration without libsystemd.
  #
  # Socket activation (sd_listen_fds(3)): when LISTEN_PID is this process and
  # LISTEN_FDS = N, descriptors 3..3+N-1 are listening sockets passed by
  # systemd. Binder adopts them; the variables are removed so children and
  # re-executed processes never adopt them a second time.
  #
  # Notification (sd_notify(3)): datagrams to the unix socket in NOTIFY_SOCKET
  # (abstract namespace when it starts with "@"). READY=1 once serving,
  # STOPPING=1 when a stop begins, WATCHDOG=1 every WATCHDOG_USEC / 2 from a
  # thread of the master. Without NOTIFY_SOCKET every call does nothing.
  module Systemd
    LISTEN_FDS_START = 3
    ENV_KEYS = %w[LISTEN_PID LISTEN_FDS LISTEN_FDNAMES].freeze

    @watchdog = nil
    @watchdog_mutex = Mutex.new
    @watchdog_cond = ConditionVariable.new

    module_function

    # The descriptors systemd passed to this process (Integers), removing the
    # environment variables. Empty when not socket-activated.
    def listen_fds(env = ENV, pid: Process.pid)
      count = env["LISTEN_FDS"]
      owner = env["LISTEN_PID"]
      ENV_KEYS.each { |key| env.delete(key) }
      return [] unless owner && count && owner.match?(/\A\d+\z/) && Integer(owner, 10) == pid
      return [] unless count.match?(/\A\d+\z/)

      (LISTEN_FDS_START...(LISTEN_FDS_START + Integer(count, 10))).to_a
    end

    # Sends one notification ("READY=1", "STATUS=...", several lines allowed).
    # Returns true when sent, false when there is no NOTIFY_SOCKET or it failed.
    def notify(state, env = ENV)
      path = env["NOTIFY_SOCKET"]
      return false if path.nil? || path.empty?

      path = "\0#{path[1..]}" if path.start_with?("@")
      socket = Socket.new(:UNIX, :DGRAM, 0)
      socket.send(state, 0, Socket.pack_sockaddr_un(path))
      true
    rescue SystemCallError, IOError, ArgumentError
      false
    ensure
      socket&.close
    end

    def notify_ready
      sent = notify("READY=1\nMAINPID=#{Process.pid}")
      start_watchdog
      sent
    end

    def notify_stopping
      stop_watchdog
      notify("STOPPING=1")
    end

    def notify_status(text)
      notify("STATUS=#{text.to_s.tr("\n", ' ')}")
    end

    # Seconds between WATCHDOG=1 pings, or nil when the watchdog is off
    # (WATCHDOG_PID, when set, must name this process).
    def watchdog_interval(env = ENV, pid: Process.pid)
      usec = env["WATCHDOG_USEC"]
      return nil unless usec&.match?(/\A\d+\z/) && Integer(usec, 10).positive?

      owner = env["WATCHDOG_PID"]
      return nil if owner && !owner.empty? && owner.to_i != pid

      Integer(usec, 10) / 2_000_000.0
    end

    def start_watchdog
      interval = watchdog_interval
      return unless interval && ENV["NOTIFY_SOCKET"]

      @watchdog_mutex.synchronize do
        return if @watchdog&.alive?

        @watchdog_stop = false
        @watchdog = Thread.new { watchdog_loop(interval) }
      end
    end

    def stop_watchdog
      thread = @watchdog_mutex.synchronize do
        @watchdog_stop = true
        @watchdog_cond.broadcast
        @watchdog
      end
      thread&.join(1) unless thread == Thread.current
      @watchdog = nil
    end

    def watchdog_loop(interval)
      Thread.current.name = "serval-watchdog"
      loop do
        notify("WATCHDOG=1")
        @watchdog_mutex.synchronize do
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + interval
          until @watchdog_stop
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0

            @watchdog_cond.wait(@watchdog_mutex, left)
          end
          return if @watchdog_stop
        end
      end
    end
  end
end
