# send_file with a Pathname (Rails.root.join): a server that serves bodies
# answering to_path from the file answers with Content-Length.
class DownloadsController < ApplicationController
  BYTES = 4 * 1024 * 1024

  def show
    send_file file, type: "application/octet-stream", filename: "download.bin"
  end

  def info
    render json: { bytes: File.size(file), md5: Digest::MD5.file(file).hexdigest }
  end

  private
    # tmp/download.bin, made once (4 MiB of a repeating pattern).
    def file
      path = Rails.root.join("tmp", "download.bin")
      unless path.exist?
        FileUtils.mkdir_p(path.dirname)
        partial = path.sub_ext(".#{Process.pid}.#{Thread.current.object_id}")
        partial.binwrite(Array.new(BYTES / 256) { |i| (i % 256).chr * 256 }.join)
        File.rename(partial, path)
      end
      path
    end
end
