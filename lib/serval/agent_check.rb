# frozen_string_literal: true

require "socket"
require "serval/threads"
require "serval/fork_hook"

module Serval
  # The HAProxy agent-check responder (option agent_check_url
  # tcp://HOST:PORT), in the master: HAProxy connects every agent-inter, this
  # writes one line from launcher.capacity (Capacity#agent_line: "up ready
  # 73%", "up drain", "down #booting", "down #stopping") and closes. Nothing
  # is read (an agent-send string is ignored). It listens from before the
  # app boots, so HAProxy hears "down #booting" rather than nothing, until
  # the launcher's run has returned. One thread answers one connection at a
  # time; each answer is a few bytes to a fresh socket buffer.
  #
  #   agent = Serval::AgentCheck.start(launcher, "tcp://127.0.0.1:9300", log_writer)
  #   ...
  #   agent.stop
  class AgentCheck
    WRITE_TIMEOUT = 1.0 # a peer that takes no bytes is dropped

    @live = []

    class << self
      def start(launcher, url, log_writer)
        new(launcher, url, log_writer).start
      end

      def track(agent) = @live << agent
      def untrack(agent) = @live.delete(agent)

      # In a forked child (a cluster worker): the listener belongs to the master.
      def after_fork_child
        @live.each(&:forget)
        @live = []
      end
    end

    attr_reader :url

    def initialize(launcher, url, log_writer)
      @launcher = launcher
      @log_writer = log_writer
      host, port = parse(url)
      @server = TCPServer.new(host, port)
      @url = "tcp://#{url[%r{\Atcp://(.+):\d+\z}, 1]}:#{@server.local_address.ip_port}"
    rescue SystemCallError, SocketError => e
      raise ConfigError, "agent_check_url: cannot listen on #{url} (#{e.message})"
    end

    # A forked child (a worker, an app's fork) closes its copy of the
    # listener at once (ForkHook, installed here), so only this process answers.
    def start
      ForkHook.on_child(AgentCheck) { AgentCheck.after_fork_child }
      self.class.track(self)
      @thread = Threads.spawn("serval-agent-check", @log_writer) { serve }
      @log_writer.info("* HAProxy agent-check on #{@url}")
      self
    end

    def stop
      self.class.untrack(self)
      @server.close unless @server.closed?
      @thread&.join(2)
    end

    # Child side of a fork: close this process's copy of the listener only.
    def forget
      @server.close unless @server.closed?
    rescue IOError
      nil
    end

    # The line answered now.
    def line
      @launcher.capacity.agent_line
    rescue StandardError => e
      @log_writer.error("serval: agent-check: #{e.class}: #{e.message}")
      "down #error\n"
    end

    private

    def parse(url)
      host, port = url.match(%r{\Atcp://\[?([^\]]+?)\]?:(\d+)\z})&.captures
      raise ConfigError, "agent_check_url: expected tcp://HOST:PORT, got #{url}" unless host

      [host, Integer(port, 10)]
    end

    def serve
      loop do
        client = @server.accept
        answer(client)
      rescue IOError, Errno::EBADF, Errno::EINVAL
        break # stop closed the listener
      rescue SystemCallError
        next # the peer went away before accept returned
      end
    end

    def answer(client)
      text = line
      until text.empty?
        written = client.write_nonblock(text, exception: false)
        if written.is_a?(Integer)
          text = text.byteslice(written..)
        elsif !client.wait_writable(WRITE_TIMEOUT)
          break
        end
      end
      client.shutdown(Socket::SHUT_WR)
      # an agent-send string already here is read, so closing does not
      # reset the connection under the answer
      client.read_nonblock(4096, exception: false)
    rescue SystemCallError, IOError
      nil
    ensure
      client.close
    end
  end
end
