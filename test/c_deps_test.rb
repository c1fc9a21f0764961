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

  # The layer rule: a core module may not reach an optional one by any path;
  # optional modules may use the core; a module in no layer is named.
  def test_layering_of_a_hand_made_graph
    edge = ->(*symbols) { CDeps::Edge.new(symbols, []) }
    layers = { core: %w[loop req hooks], optional: %w[timing gvl], entry: %w[main] }
    ok = {
      "loop" => { "hooks" => edge.("sv_hooks") }, "req" => { "hooks" => edge.("sv_hooks"), "loop" => edge.("x") },
      "hooks" => {}, "timing" => { "hooks" => edge.("sv_hooks"), "gvl" => edge.("g") }, "gvl" => {},
      "main" => { "timing" => edge.("init"), "req" => edge.("init") }
    }
    assert_empty CDeps.layering(ok, layers)

    direct = ok.merge("req" => ok["req"].merge("timing" => edge.("sv_tm_begin")))
    assert_equal ["core module req depends on optional timing: req -> timing (req -> timing: uses sv_tm_begin)"],
                 CDeps.layering(direct, layers)

    # through another core module: every core module on the way is named, each with its path
    through = ok.merge("hooks" => { "gvl" => CDeps::Edge.new([], ["hooks.h"]) })
    assert_equal ["core module hooks depends on optional gvl: hooks -> gvl (hooks -> gvl: #include in hooks.h)",
                  "core module loop depends on optional gvl: loop -> hooks -> gvl (loop -> hooks: uses sv_hooks)",
                  "core module req depends on optional gvl: req -> hooks -> gvl (req -> hooks: uses sv_hooks)"],
                 CDeps.layering(through, layers)

    assert_equal ["module stray is in no layer (tasks/c_deps.rb CORE, OPTIONAL or ENTRY)"],
                 CDeps.layering(ok.merge("stray" => {}), layers)
  end

  # check fails on a layer violation in real objects, and says why.
  def test_check_fails_when_the_core_uses_an_optional_module
    files = {
      "core.c" => "int opt_fn(void);\nint core_fn(void) { return opt_fn(); }\n",
      "opt.c" => "int opt_fn(void) { return 2; }\n",
    }
    layers = { core: ["core"], optional: ["opt"], entry: [] }
    build(files) do |src, obj|
      out = StringIO.new
      refute CDeps.check(obj, out, src: src, layers: layers)
      assert_includes out.string, "no dependency cycle among 2 modules"
      assert_includes out.string, "core module core depends on optional opt: core -> opt (core -> opt: uses opt_fn)"
      assert CDeps.check(obj, StringIO.new, src: src, layers: { core: ["opt"], optional: ["core"], entry: [] })
      assert CDeps.check(obj, StringIO.new, src: src) # no layers for another tree unless given
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
    assert_includes g["request"]["env"].symbols, "sv_build_env"
    assert_includes g["core"]["request"].symbols, "sv_request_new"
    assert_includes g["core"]["request"].symbols, "sv_polls_poll" # thread polls are in request.c
    assert_includes g["loop"].keys, "conn"
    refute_includes g["conn"].keys, "loop"
    refute_includes g["request"].keys, "balance"
    # the core reaches timing and load shedding only through hooks.h
    assert_includes out.string, "no core module depends on an optional one"
    assert_empty CDeps.layering(g, CDeps::LAYERS)
    refute_includes g["request"].keys, "timing"
    refute_includes g["loop"].keys, "shed"
    assert_includes g["timing"]["hooks"].symbols, "sv_hooks"
    assert_includes g["shed_core"]["hooks"].symbols, "sv_hooks"
    assert_includes g["request"]["hooks"].symbols, "sv_hooks"
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
