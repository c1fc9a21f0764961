# frozen_string_literal: true

require "serval/version"
require "serval/errors"
require "serval/configuration"
require "serval/log_writer"
require "serval/binder"
require "serval/launcher"
require "serval/server"
require "serval/replace_worker"

# Serval: a Rack application server with a native I/O core. See docs/DESIGN.md.
module Serval
end
