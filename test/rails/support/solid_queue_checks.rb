# frozen_string_literal: true

require "json"
require "securerandom"

module RailsIntegration
  # Solid Queue inside the server (config/puma.rb: `plugin :solid_queue if
  # ENV["SOLID_QUEUE_IN_PUMA"]`), as Rails 8 sets a single-server app up:
  # the plugin's #start runs in the supervising process, forks the Solid
  # Queue supervisor after boot (after_booted), which forks a worker, a
  # dispatcher and a scheduler; after_stopped stops it. One test per class
  # that includes this, because it ends by stopping the server: boot, a job
  # enqueued by a request runs in a worker, then TERM leaves no process.
  module SolidQueueChecks
    BOOT_DEADLINE = 60 # the supervisor boots after the server does
    JOB_DEADLINE = 60 # the worker boots after the supervisor
    EXIT_DEADLINE = 30
    GROUP_DEADLINE = 15

    def self.included(base)
      base.extend(ClassMethods)
    end

    module ClassMethods
      def command = raise(NotImplementedError)
      def env = {}
      def workers = Integer(env.fetch("WEB_CONCURRENCY", "0"))
    end

    def test_job_runs_in_the_server_and_term_leaves_no_process
      server = AppServer.new(self.class.name.split("::").last, command: self.class.command,
                                                                env: { "SOLID_QUEUE_IN_PUMA" => "1" }.merge(self.class.env))
      @app_server = server
      server.boot(workers: self.class.workers)
      # The plugin forks the supervisor from the server process when it has
      # booted; a connection open at that moment is inherited by the fork
      # (and by the supervisor's own forks), so the server's close after a
      # `Connection: close` answer sends no FIN until Solid Queue exits, and
      # this client, which reads to EOF, would wait. Puma does the same
      # (docs/rails.md). So the first request waits for the supervisor.
      server.wait_for(/Started Supervisor\(fork\)/, timeout: BOOT_DEADLINE)
      http = HttpClient.new(server.port)

      # The nil header page answers here too.
      page = http.get("/posts")
      assert_equal 200, page.status, page.head
      assert_equal [""], page.all("x-build"), page.head

      token = SecureRandom.hex(8)
      queued = http.request("POST", "/jobs?token=#{token}")
      assert_equal 202, queued.status, "#{queued.head}\n#{queued.body[0, 500]}"
      assert_equal token, JSON.parse(queued.body)["token"]

      run = poll_job(http, token)
      assert run["ran"], "the job did not run within #{JOB_DEADLINE}s: #{run.inspect}\n#{server.logs}"

      group = server.group_processes
      names = group.map(&:last)
      supervisor = names.grep(/\Asolid-queue-fork-supervisor/)
      assert_equal 1, supervisor.size, "one Solid Queue supervisor in the server's process group:\n#{format_group(group)}"
      workers = group.select { |(_pid, args)| args.start_with?("solid-queue-worker") }
      refute_empty workers, "no Solid Queue worker in the server's process group:\n#{format_group(group)}"
      assert_includes workers.map(&:first), run["pid"],
                      "the job ran in pid #{run['pid']}, not in a Solid Queue worker of this server:\n#{format_group(group)}"
      refute_equal server.pid, run["pid"]

      status = server.terminate(timeout: EXIT_DEADLINE)
      assert status, "#{server.command_line} still running #{EXIT_DEADLINE}s after TERM:\n" \
                     "#{format_group(server.group_processes)}\n#{server.logs}"
      left = server.wait_group_empty(timeout: GROUP_DEADLINE)
      assert_empty left, "#{left.size} processes of the server's group left #{GROUP_DEADLINE}s after it exited " \
                         "(#{status.inspect}):\n#{format_group(left)}\n#{server.logs}"
      assert server.wait_for(/Stopping Solid Queue/, timeout: 1)
      assert_empty server.lines_matching(/Detected Solid Queue has gone away|Solid Queue needs at least/),
                   "the supervisor died under the server, or the pool is too small for the worker"
      assert status.success? || status.termsig == Signal.list["TERM"],
             "the server exited with #{status.inspect} after TERM\n#{server.logs}"
    end

    def teardown
      @app_server&.cleanup(passed?)
      super
    end

    private

    # GET /jobs/:token until it says the job ran, at most JOB_DEADLINE s.
    def poll_job(http, token)
      deadline = now + JOB_DEADLINE
      loop do
        res = http.get("/jobs/#{token}")
        assert_equal 200, res.status, res.head
        run = JSON.parse(res.body)
        return run if run["ran"] || now > deadline

        sleep 0.25
      end
    end

    def format_group(group)
      group.map { |pid, args| "  #{pid} #{args}" }.join("\n")
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
