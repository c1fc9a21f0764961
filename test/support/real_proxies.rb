# frozen_string_literal: true

require "socket"
require_relative "http_wire"

module Serval
  # Starting and stopping real proxies (nginx, HAProxy) for the subprocess
  # tier, and reading a raw response to its end: shared by
  # test/proxy_test.rb and test/proxy_protocol_test.rb. The including test
  # sets @procs = [] in setup and stops each pid in teardown.
  module RealProxies
    SBIN = %w[/usr/sbin /sbin /usr/local/sbin].freeze # not on a non-root PATH

    def tool(name)
      path = (ENV.fetch("PATH", "").split(File::PATH_SEPARATOR) + SBIN).map { |d| File.join(d, name) }
                                                                       .find { |f| File.executable?(f) }
      skip "#{name} is not installed (apt-get install #{name}); .ci/run installs it" unless path
      path
    end

    def start_proxy(argv, port, dir)
      log = File.join(dir, "#{File.basename(argv.first)}.out")
      pid = Process.spawn(*argv, out: log, err: log, in: File::NULL, pgroup: true)
      @procs << pid
      deadline = now + 10
      begin
        TCPSocket.new("127.0.0.1", port).close
      rescue SystemCallError
        raise "#{argv.first} never listened on #{port}:\n#{File.read(log)}" if now > deadline

        sleep 0.02 # waiting for another process's listen(2); nothing to wait on
        retry
      end
    end

    # Another process's listen(2): nothing to wait on but connecting.
    def wait_listening(port)
      deadline = now + 10
      begin
        TCPSocket.new("127.0.0.1", port).close
      rescue SystemCallError
        raise "nothing listened on #{port}" if now > deadline

        sleep 0.02
        retry
      end
    end

    def stop_proxy(pid)
      Process.kill("TERM", pid)
      waiter = Process.detach(pid)
      return if waiter.join(5)

      Process.kill("KILL", -pid)
      waiter.join(5)
    rescue Errno::ESRCH
      nil
    end

    # Everything until the peer closes; raises HttpWire::WireTimeout when
    # no byte (nor the close) arrives for timeout seconds.
    def read_all(socket, timeout: 15)
      HttpWire::Client.new(socket, timeout: timeout).read_to_eof
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
