# frozen_string_literal: true

require "test_helper"
require "stringio"
require "serval/cli"

# `--name=value` is the same as `--name value` for every long option that
# takes an argument (optparse's require_exact rejects the = form by itself).
class CLIEqualsTest < Minitest::Test
  def parse(argv)
    cli = Serval::CLI.new(argv, stdout: StringIO.new, stderr: StringIO.new)
    cli.send(:parse)
    cli.instance_variable_get(:@cli)
  end

  def test_equals_form_equals_space_form
    spaced = parse(%w[--port 9393 --max-connections 50 --max-queue-time 0.05 --control-token a=b])
    equals = parse(%w[--port=9393 --max-connections=50 --max-queue-time=0.05 --control-token=a=b])
    assert_equal spaced, equals
    assert_equal "a=b", equals[:control_auth_token], "only the first = splits"
  end

  def test_a_rackup_path_with_an_equals_sign_is_not_split
    assert_equal "x=y.ru", parse(%w[--port=9393 x=y.ru])[:rackup]
  end

  def test_unknown_long_option_with_equals_is_still_an_error_naming_it
    err = StringIO.new
    status = Serval::CLI.new(%w[--no-such-flag=3], stdout: StringIO.new, stderr: err).run
    assert_equal 1, status
    assert_match(/--no-such-flag/, err.string)
  end

  def test_a_flag_without_argument_given_a_value_is_rejected
    err = StringIO.new
    status = Serval::CLI.new(%w[--no-fair-timeslice=1], stdout: StringIO.new, stderr: err).run
    assert_equal 1, status
    assert_match(/no-fair-timeslice/, err.string)
  end
end
