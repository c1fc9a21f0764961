# Active Job through Solid Queue (config/queue.yml; run inside the server
# with SOLID_QUEUE_IN_PUMA=1, the config/puma.rb plugin line). A JSON API,
# hence ActionController::API: no session, no CSRF token.
class JobsController < ActionController::API
  # POST /jobs: enqueues a RecordTokenJob; 202 with the token to poll.
  def create
    token = params[:token].presence || SecureRandom.hex(8)
    job = RecordTokenJob.perform_later(token)
    render json: { token: token, job_id: job.job_id, server_pid: Process.pid }, status: :accepted
  end

  # GET /jobs/:token: whether the job ran, and in which process.
  def show
    run = JobRun.find_by(token: params[:token])
    render json: { token: params[:token], ran: !run.nil?, pid: run&.pid, ran_at: run&.created_at,
                   server_pid: Process.pid }
  end
end
