# frozen_string_literal: true

require_relative "test_helper"
require "rbconfig"
require "shellwords"
require "stringio"
require "tmpdir"
require_relative "../tasks/c_deps"

# tasks/c_deps.rb: the module graph of ext/serval (nm on the objects, plus
# #include "x.h") and its cycles; rake c_deps fails on one.
class CDepsTest < Minitest::Test
  def test_cycles_of_a_hand_made_graph
    assert_empty CDeps.cycles({ "a" => ["b"], "b" => ["c"], "c" => [], "d" => %w[a c] })
    assert_equal [%w[a b c]], CDeps.cycles({ "a" => ["b"], "b" => ["c"], "c" => ["a"], "d" => ["a"] })
    # two cycles, one inside a longer path; a module on no cycle is not named
    g = { "x" => ["y"], "y" => %w[x z], "z" => ["w"], "w" => %w[v z], "v" => [] }
    assert_equal [%w[w z], %w[x y]], CDeps.cycles(g)
  end

  # The whole check on small C files: symbol edges from nm, include edges,
  # and a cycle made by either.
  def test_check_finds_symbol_and_include_cycles
    files = {
      "a.c" => "int b_fn(void);\nint a_fn(void) { return b_fn(); }\n",
      "b.c" => "#include \"c.h\"\nint b_fn(void) { return c_fn(); }\n",
      "c.h" => "int c_fn(void);\n",
      "c.c" => "int c_fn(void) { return 1; }\n",
    }
    build(files) do |src, obj|
      g = CDeps.graph(obj, src)
      assert_equal %w[a b c], g.keys.sort
      assert_equal ["b"], g["a"].keys
      assert_equal ["b_fn"], g["a"]["b"].symbols
      assert_equal ["c_fn"], g["b"]["c"].symbols
      assert_equal ["b.c"], g["b"]["c"].includes
      assert_empty CDeps.cycles(g)
      out = StringIO.new
      assert CDeps.check(obj, out, src: src), out.string
      assert_includes out.string, "a -> b\n"
      assert_includes out.string, "no dependency cycle among 3 modules"
    end

    build(files.merge("c.c" => "int a_fn(void);\nint c_fn(void) { return a_fn(); }\n")) do |src, obj|
      out = StringIO.new
      refute CDeps.check(obj, out, src: src)
      assert_includes out.string, "1 dependency cycle(s)"
      assert_includes out.string, "cycle: a b c\n"
      assert_includes out.string, "    c -> a: uses a_fn\n"
    end

    build(files.merge("d.c" => "#include \"e.h\"\n", "e.h" => "", "e.c" => "#include \"d.h\"\n", "d.h" => "")) do |src, obj|
      out = StringIO.new
      refute CDeps.check(obj, out, src: src)
      assert_includes out.string, "cycle: d e\n"
      assert_includes out.string, "    d -> e: #include in d.c\n"
    end
  end

  def test_a_source_not_compiled_is_an_error
    build({ "a.c" => "int a;\n" }) do |src, obj|
      File.write(File.join(src, "b.c"), "int b;\n")
      error = assert_raises(ArgumentError) { CDeps.graph(obj, src) }
      assert_includes error.message, "not compiled in #{obj}: b"
    end
  end

  # The extension as built for this Ruby (rake compile, which rake test runs
  # first) has no cycle, and its graph is the real one.
  def test_the_extension_has_no_cycle
    objdir = CDeps.default_objdir
    assert File.exist?(File.join(objdir, "core.o")), "no build in #{objdir}: run bundle exec rake compile"
    out = StringIO.new
    assert CDeps.check(objdir, out), out.string
    g = CDeps.graph(objdir)
    assert_includes g["request"]["head"].symbols, "sv_write_head"
    assert_includes g["loop"].keys, "conn"
    refute_includes g["conn"].keys, "loop"
    refute_includes g["head"].keys, "balance"
  end

  private

  # Writes files into src/, compiles each .c into obj/, yields both.
  def build(files)
    Dir.mktmpdir("c-deps-") do |dir|
      src = File.join(dir, "src")
      obj = File.join(dir, "obj")
      Dir.mkdir(src)
      Dir.mkdir(obj)
      files.each { |name, text| File.write(File.join(src, name), text) }
      cc = Shellwords.split(ENV.fetch("CC", RbConfig::CONFIG["CC"] || "cc"))
      Dir[File.join(src, "*.c")].each do |c|
        o = File.join(obj, File.basename(c, ".c") + ".o")
        assert system(*cc, "-c", "-o", o, c), "#{cc.join(' ')} -c #{c} failed"
      end
      yield src, obj
    end
  end
end
