# frozen_string_literal: true

require "serval/version"

module Serval
  # The compact process titles `ps` shows; cheap (one string, one prctl).
  # The tag, as Puma's: the option's value, or when none was given the name
  # of the directory the server runs in; an empty tag shows none.
  #
  #   serval 0.1.0 (tcp://0.0.0.0:9292) cluster: 2/2 workers [tag]
  #   serval: worker 0 3/5 threads busy, 1234 requests [tag]
  #   serval: mold (from worker 0) [tag]
  # The tag comes last: the kernel keeps only as much of a title as the
  # original command line had room for.
  module ProcessTitle
    module_function

    def master(binds, tag, booted: nil, wanted: nil)
      title = +"serval #{VERSION} (#{binds.join(',')})"
      title << " cluster: #{booted}/#{wanted} workers" if wanted
      title << label(tag)
      set(title)
    end

    def worker(index, tag, stats)
      title = +"serval: worker #{index}"
      if stats
        title << " #{stats[:busy_threads]}/#{stats[:max_threads]} threads busy, #{stats[:requests_count]} requests"
      end
      title << label(tag)
      set(title)
    end

    def mold(index, tag)
      title = +"serval: mold (from worker #{index})"
      title << label(tag)
      set(title)
    end

    def label(tag)
      tag = File.basename(Dir.pwd) if tag.nil?
      tag.empty? ? "" : " [#{tag}]"
    rescue SystemCallError # the working directory was removed
      ""
    end

    def set(title)
      Process.setproctitle(title)
      title
    end
  end
end
