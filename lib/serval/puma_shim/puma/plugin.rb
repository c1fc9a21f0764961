# frozen_string_literal: true

# Serval's stand-in for Puma's plugin API, loaded by Serval::PumaPlugins only
# when the puma gem cannot be loaded (an app whose bundle has no puma). It
# defines the few names a Puma plugin file uses: Puma::Plugin.create,
# #in_background, the Puma::Plugins registry, Puma::Const::VERSION (the Puma
# API Serval follows), an empty Puma::DSL for plugins that add config
# methods, and Puma.stats / Puma.stats_hash. With the real gem present none
# of this is loaded: the real Puma's classes are used instead.
module Puma
  class UnknownPlugin < RuntimeError; end

  module Const
    # The Puma API version Serval's plugin host follows (events under both
    # the 7/8 and the 5/6 names).
    VERSION = PUMA_VERSION = "8.0.0"
  end

  # Config methods a plugin adds (`class Puma::DSL; def x ...`) are run by
  # Serval::DSL on an instance of this class (Serval::PumaPlugins.call_dsl).
  class DSL; end

  # name => plugin class; the blocks given to Plugin#in_background.
  class PluginRegistry
    def initialize
      @plugins = {}
      @background = []
    end

    def register(name, cls)
      @plugins[name.to_s] = cls
    end

    def find(name)
      name = name.to_s
      return @plugins[name] if @plugins.key?(name)

      begin
        require "puma/plugin/#{name}"
      rescue LoadError
        raise UnknownPlugin, "Unable to find plugin: #{name}"
      end
      @plugins.fetch(name) { raise UnknownPlugin, "puma/plugin/#{name} did not register a plugin" }
    end

    def add_background(blk)
      @background << blk
    end

    def fire_background
      @background.each_with_index do |blk, i|
        Thread.new do
          Puma.set_thread_name("plgn bg #{i}")
          blk.call
        end
      end
    end
  end

  Plugins = PluginRegistry.new

  class Plugin
    # A plugin is named by its file: .../puma/plugin/NAME.rb.
    def self.create(&blk)
      file = caller_locations(1, 1).first.path
      name = file[%r{puma/plugin/([^/]+)\.rb\z}, 1] or raise UnknownPlugin, "#{file} is not under puma/plugin/"
      cls = Class.new(self)
      cls.class_eval(&blk)
      Plugins.register(name, cls)
    end

    def in_background(&blk)
      Plugins.add_background(blk)
    end
  end

  class << self
    def stats_object=(object)
      @get_stats = object
    end

    def stats_hash
      @get_stats.stats
    end

    def stats
      require "json"
      JSON.generate(stats_hash)
    end

    def set_thread_name(name)
      Thread.current.name = "puma #{name}"
    end
  end
end
