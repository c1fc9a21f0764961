# frozen_string_literal: true

require "serval/advice/quantile"
require "serval/advice/distribution"
require "serval/advice/workload"
require "serval/advice/window"
require "serval/advice/simulation"
require "serval/advice/lock"
require "serval/advice/amdahl"
require "serval/advice/gvl_ceiling"
require "serval/advice/machine"
require "serval/advice/sweep"
require "serval/advice/stall_estimate"
require "serval/advice/processes"
require "serval/advice/database"
require "serval/advice/capacity"
require "serval/advice/steadiness"
require "serval/advice/routes"
require "serval/advice/recommender"

module Serval
  # Concurrency advice from measurement: how many threads per process,
  # processes per machine, database connections and machines for a target,
  # decided by simulating one process fed with the recorded per-request
  # figures (see Window for the input, Recommender for the output, and
  # bench/NOTES.md "Tuning" for the method and its limits). Pure objects: no server,
  # no clock, a seeded RNG - the same window gives the same advice.
  module Advice
    # Every limit the advice uses, in one place.
    DEFAULTS = {
      min_requests: 300,        # fewer measured requests: no numbers, say how many are needed
      knee_fraction: 0.95,      # the knee: fewest threads reaching this share of the sweep's best req/s
      sweep_max: 16,            # thread counts simulated: 1..sweep_max
      # requests simulated per point: at 10k / 50k the advice on 29 recorded windows moves from 20k / 100k's
      # by less than 20k / 100k's own moves with another seed (bench/advice_speed, bench/NOTES.md)
      sim_requests: 10_000,     # requests simulated per point
      load_requests: 50_000,    # requests simulated per open-loop point (a p99 near capacity needs more)
      seed: 1,
      quantum: Simulation::QUANTUM,
      memory_headroom: 0.2,     # share of the memory budget left free
      target_utilization: 0.8,  # capacity plans run each process at this share of its max req/s
      load_points: [0.5, 0.8],  # open-loop p50/p99 predicted at these shares of max req/s
      range: true,              # threads_range: the knee at the ends of the run/io ratio's 95 % interval
      precision: true           # also max req/s and p99 at the top load point for the window's sampling error
    }.freeze

    # See Recommender#call for the result's shape.
    def self.recommend(window, **options)
      Recommender.new(window, **options).call
    end
  end
end
