# One row per RecordTokenJob run: the token POST /jobs enqueued and the pid
# of the process that ran it (a Solid Queue worker, not the web server).
class CreateJobRuns < ActiveRecord::Migration[8.1]
  def change
    create_table :job_runs do |t|
      t.string :token, null: false, index: { unique: true }
      t.integer :pid, null: false
      t.timestamps
    end
  end
end
