# frozen_string_literal: true

module Serval
  # The launcher's lifecycle events, under Puma's names: a plugin's
  # `launcher.events.after_booted { ... }` and a config file's
  # `after_booted { ... }` both land here. Puma 7/8's names and the 5/6
  # names before them are accepted alike (on_booted is after_booted).
  #
  #   after_booted    once, when the server first serves (cluster: every
  #                   worker booted)
  #   before_restart  before a hot restart (USR2, `restart`, tmp_restart)
  #   after_stopped   once, after a stop (not before a hot restart's exec)
  #
  # A hook that raises is logged and the others still run, as in Puma.
  class Events
    NAMES = %i[after_booted before_restart after_stopped].freeze
    OLD_NAMES = { on_booted: :after_booted, on_restart: :before_restart, on_stopped: :after_stopped }.freeze

    def initialize(log_writer = nil)
      @log_writer = log_writer
      @hooks = NAMES.to_h { |n| [n, []] }
      @fired = {}
      @mutex = Mutex.new
    end

    # Registers a callable (or the block) for an event; returns it.
    def register(name, callable = nil, &block)
      raise ArgumentError, "give either a callable or a block, not both" if callable && block

      hook = callable || block
      raise ArgumentError, "#{name}: give a block" unless hook

      @mutex.synchronize { @hooks.fetch(canonical(name)) << hook }
      hook
    end

    NAMES.each do |name|
      define_method(name) { |&block| register(name, &block) }
    end

    OLD_NAMES.each do |old, name|
      define_method(old) { |&block| register(name, &block) }
    end

    # Runs every hook of the event in order, in the calling thread.
    def fire(name, *args)
      hooks = @mutex.synchronize { @hooks.fetch(canonical(name)).dup }
      hooks.each do |hook|
        hook.call(*args)
      rescue StandardError => e
        @log_writer ? @log_writer.exception(e, "serval: #{name} hook failed") : warn("serval: #{name} hook failed: #{e.message}")
      end
      nil
    end

    # fire, once per name over the life of this object.
    def fire_once(name, *args)
      first = @mutex.synchronize { !@fired[name] && (@fired[name] = true) }
      fire(name, *args) if first
    end

    # Puma's own method names for the three events.
    def fire_after_booted! = fire_once(:after_booted)
    def fire_before_restart! = fire(:before_restart)
    def fire_after_stopped! = fire_once(:after_stopped)

    private

    def canonical(name)
      name = name.to_sym
      name = OLD_NAMES.fetch(name, name)
      raise ArgumentError, "unknown event #{name.inspect} (#{NAMES.join(', ')})" unless @hooks.key?(name)

      name
    end
  end
end
