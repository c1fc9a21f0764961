# frozen_string_literal: true

require "fileutils"
require "securerandom"

module Serval
  # Writes a whole small file (the state file, the pidfile) so that readers
  # see the old content or the new, never a part, and so that nothing planted
  # beside it can read or redirect the write: the temp file has a random name
  # and is created exclusively (O_EXCL, which also refuses a symlink in its
  # place) with the given mode whatever the umask; rename replaces a symlink
  # at the path itself, never its target.
  module AtomicFile
    module_function

    # Raises SystemCallError; a temp file it created is removed on failure.
    def write(path, data, mode)
      FileUtils.mkdir_p(File.dirname(path))
      tmp = "#{path}.#{SecureRandom.hex(8)}.tmp"
      created = nil
      File.open(tmp, File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW, mode) do |f|
        created = tmp
        f.chmod(mode)
        f.write(data)
      end
      File.rename(tmp, path)
      created = nil
    ensure
      File.unlink(created) if created && File.exist?(created) # ours, left by a failed write
    end
  end
end
