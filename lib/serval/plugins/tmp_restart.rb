# frozen_string_literal: true

require "serval/plugins"
require "serval/ticker"

module Serval
  module Plugins
    # `plugin :tmp_restart`: when tmp/restart.txt (under the app directory)
    # appears or its modification time changes after boot, the launcher is
    # told to hot restart, as USR2 does (`bin/rails restart` touches the
    # file). A thread looks every INTERVAL seconds and only queues the
    # command; the supervisor loop does the restart. A deleted file restarts
    # nothing.
    class TmpRestart
      PATH = "tmp/restart.txt"
      INTERVAL = 1.0 # seconds between looks (Puma's plugin: 2 s)
      BOOT_WAIT = 86_400

      attr_reader :path

      def initialize(launcher, interval: INTERVAL)
        @launcher = launcher
        @interval = interval
        @path = File.expand_path(PATH, launcher.options[:directory] || Dir.pwd)
        @seen = signature # taken before boot: a touch while the app boots restarts it once it serves
      end

      def start
        @ticker = Ticker.new("serval-tmp-restart", @interval, @launcher.log_writer, first: :tick,
                             ready: -> { @launcher.wait_until_booted(BOOT_WAIT) }).start { check }
        self
      end

      def stop
        @ticker&.stop
      end

      # One look: queues a restart when the file appeared or changed since
      # the last look (or since #initialize); true when it did.
      def check
        now = signature
        return false if now == @seen

        @seen = now
        return false unless now

        @launcher.log_writer.info("- #{@path} changed: hot restart (plugin tmp_restart)")
        @launcher.enqueue(:restart)
        true
      end

      private

      def signature
        stat = File.stat(@path)
        [stat.mtime, stat.ino, stat.size]
      rescue SystemCallError
        nil
      end
    end
  end
end
