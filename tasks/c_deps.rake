# frozen_string_literal: true

# The module graph of ext/serval has no cycle (tasks/c_deps.rb); part of the
# default task. Loaded by the main Rakefile.
require_relative "c_deps"

desc "Check that ext/serval's modules depend on each other without a cycle (from the compiled objects)"
task c_deps: :compile do
  abort "c_deps: ext/serval has a dependency cycle, or a core module depends on an optional one (above)" unless CDeps.check(verbose: ENV["VERBOSE"] == "1")
end
