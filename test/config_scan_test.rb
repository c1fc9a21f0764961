# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "serval/config_scan"

# servalctl's reading of a config file: parsed, never run; literal strings only.
class ConfigScanTest < Minitest::Test
  def scan(source)
    Dir.mktmpdir("serval-scan-") do |dir|
      path = File.join(dir, "puma.rb")
      File.write(path, source)
      s = Serval::ConfigScan.new(path)
      [s.values, s.unreadable]
    end
  end

  def test_literal_calls
    values, unreadable = scan(<<~RUBY)
      raise "never run"
      require_relative "environment"
      activate_control_app "unix://tmp/ctl.sock", auth_token: 's3cret'
      state_path("tmp/pids/serval.state")
    RUBY
    assert_equal({ control_url: "unix://tmp/ctl.sock", control_auth_token: "s3cret", state_path: "tmp/pids/serval.state" },
                 values)
    assert_empty unreadable
    assert_equal({ control_url: "tcp://127.0.0.1:9293", control_auth_token: "t" },
                 scan(%(control_url "tcp://127.0.0.1:9293"\ncontrol_auth_token "t"\n)).first)
    assert_equal({ control_url: "unix://x", control_auth_token: "t" },
                 scan(%(activate_control_app("unix://x", { auth_token: "t" })\n)).first)
  end

  def test_non_literal_values_are_unreadable
    values, unreadable = scan(<<~'RUBY')
      activate_control_app "unix://#{Dir.pwd}/ctl.sock", auth_token: ENV.fetch("T")
      state_path path
    RUBY
    assert_empty values
    assert_equal %i[control_url control_auth_token state_path], unreadable.keys
    assert_equal "line 1: `activate_control_app` is not given a literal string", unreadable[:control_url]
    assert_equal "line 2: `state_path` is not given a literal string", unreadable[:state_path]
    assert_equal({ control_url: "unix://x" }, scan(%(activate_control_app "unix://x"\n)).first, "a token generated at boot")
  end

  # A call under a condition or in a block may or may not run.
  def test_conditional_calls_are_unreadable
    ["control_url 'unix://x' if ENV['C']", "if production?\n  control_url 'unix://x'\nend",
     "on_booted { control_url 'unix://x' }", "ENV['C'] && control_url('unix://x')",
     "def x\n  control_url 'unix://x'\nend"].each do |source|
      values, unreadable = scan(source)
      assert_empty values, source
      assert_match(/is called under a condition or in a block/, unreadable[:control_url], source)
    end
  end

  # As the file would run: the last unconditional call wins.
  def test_later_calls_replace_earlier_ones
    assert_equal [{ control_url: "unix://b" }, {}], scan("control_url ENV['X']\ncontrol_url 'unix://b'\n")
    assert_equal({}, scan("control_url 'unix://a'\ncontrol_url ENV['X']\n").first)
    assert_equal({ control_url: "unix://a" }, scan("control_url 'unix://b'\ncontrol_url 'unix://a'\n").first)
  end

  def test_a_file_that_does_not_parse
    values, unreadable = scan("activate_control_app 'unix://x',, )\n")
    assert_empty values
    assert_equal ["the file does not parse as Ruby"], unreadable.values.uniq
  end
end
