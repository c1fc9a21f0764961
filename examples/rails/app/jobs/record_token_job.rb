# Enqueued by POST /jobs; writes a JobRun row with the token and this
# process's pid, which GET /jobs/:token reads back.
class RecordTokenJob < ApplicationJob
  queue_as :default

  def perform(token)
    JobRun.create_or_find_by!(token: token) { |run| run.pid = Process.pid }
  end
end
