# frozen_string_literal: true

# docs/DESIGN.md names files and threads; each must exist under that name: a
# path (ext/..., lib/..., bench/..., test/..., docs/...) as a file or
# directory of the repository, a thread name ("serval-..." in quotes or
# backticks) as a quoted string outside comments in lib/ or ext/. A thread
# named with a number (serval-worker-1, serval-worker-2, ...) is written
# "serval-worker-N" (or with a number) in the doc and made from
# "serval-worker-..." in the code.
# (Each test is bounded by test_helper's per-test deadline.)
require_relative "test_helper"

class DesignDocTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  DOC = File.join(ROOT, "docs", "DESIGN.md")
  PATH = %r{\b(?:ext|lib|bench|test|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_/]}
  THREAD = /["`](serval-[a-z0-9-]*[a-z0-9](?:-N)?)["`]/

  def doc = File.read(DOC)

  def paths = doc.scan(PATH).uniq

  def threads = doc.scan(THREAD).flatten.uniq

  # Every quoted string in lib/ and ext/ source, comment lines left out.
  def source_strings
    @source_strings ||= Dir[File.join(ROOT, "{lib,ext}", "**", "*.{rb,c,h}")].flat_map do |file|
      File.readlines(file).reject { |l| l.lstrip.start_with?("#", "*", "/*", "//") }.flat_map { |l| l.scan(/"([^"]*)"/).flatten }
    end.uniq
  end

  def thread_in_source?(name)
    return source_strings.include?(name) unless name.match?(/-(N|\d+)\z/)

    prefix = name.sub(/(N|\d+)\z/, "")
    source_strings.any? { |s| s.start_with?(prefix) && s.size > prefix.size }
  end

  def test_the_doc_names_files_and_threads
    assert_operator paths.size, :>=, 30, "the path pattern found too few paths: #{paths.inspect}"
    assert_operator threads.size, :>=, 10, "the thread pattern found too few names: #{threads.inspect}"
  end

  def test_every_path_it_names_exists
    missing = paths.reject { |p| File.exist?(File.join(ROOT, p)) }
    assert_empty missing, "docs/DESIGN.md names paths that do not exist"
  end

  def test_every_thread_it_names_is_made_under_that_name
    missing = threads.reject { |name| thread_in_source?(name) }
    assert_empty missing, "docs/DESIGN.md names threads that lib/ and ext/ do not make"
  end

  def test_a_wrong_name_would_be_caught
    refute thread_in_source?("serval-error-log")
    refute thread_in_source?("serval-i")
    assert thread_in_source?("serval-io")
    assert thread_in_source?("serval-worker-N")
    assert thread_in_source?("serval-worker-3")
    assert_includes threads, "serval-worker-N"
    refute File.exist?(File.join(ROOT, "lib/serval/no_such_file.rb"))
  end
end
