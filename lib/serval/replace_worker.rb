# frozen_string_literal: true

module Serval
  class << self
    # Asks the master to replace this cluster worker once every other worker
    # is booted (gracefully, like worker_max_requests); the reason goes to the
    # log. Returns false (and does nothing) outside a cluster worker.
    def replace_worker(reason)
      hook = @replace_worker
      return false unless hook

      hook.call(reason)
      true
    end

    attr_writer :replace_worker # set by the cluster worker (Cluster::Worker)
  end
end
