# The benchmark's actions (bench/run rails) and a CPU-bound one.
class PagesController < ApplicationController
  # GET /plain: no database, a tiny text body.
  def plain
    render plain: "ok"
  end

  # GET /db: a read of ten rows (db/seeds.rb makes them).
  def db
    render json: Post.order(:id).limit(10).pluck(:id, :title)
  end

  # GET /slow?ms=80: a slow query: PostgreSQL sleeps ms milliseconds
  # (pg_sleep) while the thread waits on its connection's socket.
  def slow
    seconds = params.fetch(:ms, 80).to_f.clamp(0.0, 1000.0) / 1000.0
    ActiveRecord::Base.with_connection { |c| c.select_value("SELECT 1 FROM pg_sleep(#{format('%.4f', seconds)})") }
    render plain: "slept"
  end

  # GET /cpu?ms=20: computes for ms milliseconds of this thread's CPU time.
  def cpu
    ms = params.fetch(:ms, 20).to_f.clamp(0.0, 1000.0)
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    start = Process.clock_gettime(clock)
    n = 0
    n += 1 while (Process.clock_gettime(clock) - start) * 1000 < ms
    render json: { cpu_ms: ((Process.clock_gettime(clock) - start) * 1000).round(2), iterations: n }
  end
end
