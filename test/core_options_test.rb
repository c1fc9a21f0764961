# frozen_string_literal: true

require_relative "test_helper"
require "serval/serval_ext"

# One source of truth for the core's limits: every bound the configuration
# accepts, Native::Core.new accepts too, and just past it both refuse, naming
# the option. (They once disagreed: max_headers 10,000 and output_buffer
# 1,024 passed the configuration and made every cluster worker fail after
# fork, forever.)
class CoreOptionsTest < Minitest::Test
  OPTIONS = Serval::Native::Core::OPTIONS

  def test_the_configuration_takes_its_defaults_and_bounds_from_the_core
    OPTIONS.each do |key, (default, min, max)|
      assert_equal default, Serval::Configuration::DEFAULTS.fetch(key), key
      assert_equal [min, max], Serval::Configuration::RULES.fetch(key)[1, 2], key
    end
  end

  def test_every_extreme_passes_both_or_neither
    OPTIONS.each do |key, (_default, min, max)|
      step = if min.is_a?(Integer) then 1 elsif min.zero? then 1.0 else min / 2.0 end
      [min, max].each do |value|
        assert_equal value, Serval::Configuration.coerce(key, value), "#{key} #{value}"
        core = Serval::Native::Core.new(core_options(key, value))
        refute_nil core, "#{key} #{value}"
      end
      [min - step, max + step].each do |value|
        error = assert_raises(Serval::ConfigError, "#{key} #{value}") { Serval::Configuration.coerce(key, value) }
        assert_match(/\A#{key}/, error.message)
        error = assert_raises(ArgumentError, "#{key} #{value}") { Serval::Native::Core.new(core_options(key, value)) }
        assert_match(/\A#{key} must be in/, error.message)
      end
    end
  end

  def test_nan_is_refused_by_the_core
    error = assert_raises(ArgumentError) { Serval::Native::Core.new(read_timeout: Float::NAN) }
    assert_match(/read_timeout/, error.message)
  end

  # max_request_line must fit in max_head: keep the pair consistent while
  # probing one of them at its extreme.
  def core_options(key, value)
    opts = { key => value }
    opts[:max_head] = value.clamp(OPTIONS[:max_head][1], OPTIONS[:max_head][2]) if key == :max_request_line
    opts
  end
end
