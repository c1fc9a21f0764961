# frozen_string_literal: true

require_relative "test_helper"
require "serval/process_title"

# The process title's tag, as Puma's: given, inferred from the directory, or none.
class ProcessTitleTest < Minitest::Test
  def setup
    @title = File.read("/proc/self/cmdline").split("\0").join(" ")
  end

  def teardown
    Process.setproctitle(@title)
  end

  def test_a_given_tag_is_shown
    assert_equal "serval: worker 1 [web]", Serval::ProcessTitle.worker(1, "web", nil)
  end

  def test_no_tag_given_shows_the_directory_name
    Dir.mktmpdir("title-app") do |dir|
      Dir.chdir(dir) do
        title = Serval::ProcessTitle.master(["tcp://0.0.0.0:1"], nil)
        assert_equal "serval #{Serval::VERSION} (tcp://0.0.0.0:1) [#{File.basename(dir)}]", title
      end
    end
  end

  def test_an_empty_tag_shows_none
    assert_equal "serval: mold (from worker 0)", Serval::ProcessTitle.mold(0, "")
  end
end
