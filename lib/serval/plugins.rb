# frozen_string_literal: true

module Serval
  # The plugins a config file names with `plugin :name` (Puma's names), run
  # in the supervising process (single mode, or the cluster master) beside
  # the launcher. Each is a class with #start and #stop; see
  # lib/serval/plugins/tmp_restart.rb. Configuration::PLUGINS lists them.
  module Plugins
    CLASSES = { "tmp_restart" => "TmpRestart" }.freeze

    module_function

    # Starts every plugin in launcher.options[:plugins]; returns them.
    def start(launcher)
      launcher.options.fetch(:plugins, []).map do |name|
        require "serval/plugins/#{name}"
        const_get(CLASSES.fetch(name)).new(launcher).start
      end
    end
  end
end
