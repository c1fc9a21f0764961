# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "rbconfig"
require "tmpdir"
require "fileutils"

# Serval from a Gemfile `path:` source is not compiled: loading it must say
# how to build the extension rather than only "cannot load such file".
class NativeExtTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  def test_missing_extension_says_what_to_run
    Dir.mktmpdir("serval-noext-") do |dir|
      FileUtils.cp_r(LIB, dir)
      FileUtils.rm_f(Dir[File.join(dir, "lib/**/*.so")])
      root = File.realpath(dir)
      # Outside Bundler: it (or RubyGems under it) would find this checkout's extension.
      env = ENV.keys.grep(/\A(BUNDLE|GEM_|RUBY)/).to_h { |k| [k, nil] }
      out, status = Open3.capture2e(env, RbConfig.ruby, "-I", File.join(root, "lib"), "-e", 'require "serval/server"')
      refute status.success?, out
      assert_includes out, "serval: the native extension is not built for this Ruby (#{RUBY_VERSION})"
      assert_includes out, "cd #{root} && bundle install && bundle exec rake compile"
      assert_includes out, "(LoadError)"
    end
  end

  # Another LoadError (not the extension's) is not reworded.
  def test_other_load_errors_pass_through
    error = assert_raises(LoadError) { require "serval/no_such_file" }
    assert_includes error.message, "cannot load such file -- serval/no_such_file"
  end
end
