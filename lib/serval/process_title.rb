# frozen_string_literal: true

require "serval/version"

module Serval
  # The compact process titles `ps` shows; cheap (one string, one prctl).
  #
  #   serval 0.1.0 (tcp://0.0.0.0:9292) [tag] cluster: 2/2 workers
  #   serval: worker 0 [tag] 3/5 threads busy, 1234 requests
  #   serval: mold (from worker 0) [tag]
  module ProcessTitle
    module_function

    def master(binds, tag, booted: nil, wanted: nil)
      title = +"serval #{VERSION} (#{binds.join(',')})"
      title << " [#{tag}]" if tag
      title << " cluster: #{booted}/#{wanted} workers" if wanted
      set(title)
    end

    def worker(index, tag, stats)
      title = +"serval: worker #{index}"
      title << " [#{tag}]" if tag
      if stats
        title << " #{stats[:busy_threads]}/#{stats[:max_threads]} threads busy, #{stats[:requests_count]} requests"
      end
      set(title)
    end

    def mold(index, tag)
      title = +"serval: mold (from worker #{index})"
      title << " [#{tag}]" if tag
      set(title)
    end

    def set(title)
      Process.setproctitle(title)
      title
    end
  end
end
