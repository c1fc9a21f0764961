# frozen_string_literal: true

# The module graph of ext/serval, and its cycles.
#
# A module is a base name: x.c and x.h are module x (a header without a .c,
# such as serval.h, is a module of its own). Module A depends on module B
# when
#   - A's object uses a symbol B's object defines (nm: undefined in A.o,
#     defined in B.o), or
#   - a file of A includes "b.h".
# The extension must have no cycle: each module can then be read knowing only
# the modules below it.
#
#   ruby tasks/c_deps.rb [OBJDIR]     # OBJDIR: default, this Ruby's build under tmp/
#
# prints the graph and exits 1 naming every cycle (rake c_deps runs it).
module CDeps
  ROOT = File.expand_path("..", __dir__)
  SRC = File.join(ROOT, "ext/serval")

  # An edge A -> B and why: the symbols A uses from B, the files of A that include b.h.
  Edge = Struct.new(:symbols, :includes) do
    def why
      parts = []
      parts << "uses #{symbols.sort.first(4).join(', ')}#{symbols.size > 4 ? ", +#{symbols.size - 4}" : ''}" unless symbols.empty?
      parts << "includes #{includes.sort.join(', ')}" unless includes.empty?
      parts.join("; ")
    end
  end

  module_function

  # This Ruby's objects, where rake-compiler builds them.
  def default_objdir
    File.join(ROOT, "tmp", RUBY_PLATFORM, "serval_ext", RUBY_VERSION)
  end

  # {module => {dep => Edge}} from the objects in objdir and the sources in src.
  def graph(objdir = default_objdir, src = SRC)
    sources = Dir[File.join(src, "*.{c,h}")].sort
    modules = sources.map { |f| File.basename(f).sub(/\.[ch]\z/, "") }.uniq
    g = modules.to_h { |m| [m, {}] }
    add = ->(from, to) { g[from][to] ||= Edge.new([], []) }

    c_modules = sources.grep(/\.c\z/).map { |f| File.basename(f, ".c") }
    objects = c_modules.to_h { |m| [m, File.join(objdir, "#{m}.o")] }
    missing = objects.reject { |_, o| File.exist?(o) }.keys
    raise ArgumentError, "not compiled in #{objdir}: #{missing.join(', ')} (run rake compile)" unless missing.empty?

    defs = {}
    undefs = {}
    objects.each do |m, o|
      defined, used = nm(o)
      defined.each { |s| defs[s] = m }
      undefs[m] = used
    end
    undefs.each do |m, used|
      used.each do |s|
        owner = defs[s]
        add.(m, owner).symbols << s if owner && owner != m
      end
    end

    sources.each do |f|
      m = File.basename(f).sub(/\.[ch]\z/, "")
      File.foreach(f) do |line|
        next unless (inc = line[/\A\s*#\s*include\s+"([^"]+)\.h"/, 1])

        add.(m, inc).includes << File.basename(f) if g.key?(inc) && inc != m
      end
    end
    g
  end

  # [defined, undefined] global symbols of an object.
  def nm(object)
    out = IO.popen(["nm", "--defined-only", "-g", object], &:read)
    raise "nm #{object} failed" unless $?.success?

    defined = out.lines.filter_map { |l| l.split[2] }
    out = IO.popen(["nm", "--undefined-only", "-g", object], &:read)
    raise "nm #{object} failed" unless $?.success?

    [defined, out.lines.filter_map { |l| l.split.last }]
  end

  # The strongly connected components with more than one module (Tarjan),
  # each sorted, sorted by their first module. g: {node => [deps] or {dep => _}}.
  def cycles(g)
    index = {}
    low = {}
    stack = []
    on = {}
    out = []
    n = 0
    visit = lambda do |v|
      index[v] = low[v] = n
      n += 1
      stack << v
      on[v] = true
      (g[v] || []).each do |w, _|
        if !index.key?(w)
          visit.(w)
          low[v] = [low[v], low[w]].min
        elsif on[w]
          low[v] = [low[v], index[w]].min
        end
      end
      return unless low[v] == index[v]

      scc = []
      loop do
        w = stack.pop
        on[w] = false
        scc << w
        break if w == v
      end
      out << scc.sort if scc.size > 1
    end
    g.keys.sort.each { |v| visit.(v) unless index.key?(v) }
    out.sort
  end

  # The graph as text: a line per module with what it depends on and why.
  def render(g)
    g.keys.sort.map do |m|
      deps = g[m]
      head = deps.empty? ? "#{m}: -" : "#{m}: #{deps.keys.sort.join(' ')}"
      [head, *deps.keys.sort.map { |d| "    -> #{d}: #{deps[d].why}" }].join("\n")
    end.join("\n")
  end

  # The lines naming each cycle and the edges inside it; empty when none.
  def report(g)
    cycles(g).map do |scc|
      edges = scc.flat_map { |a| g[a].keys.select { |b| scc.include?(b) }.sort.map { |b| "    #{a} -> #{b}: #{g[a][b].why}" } }
      ["cycle: #{scc.join(' ')}", *edges].join("\n")
    end
  end

  # Prints the graph, then every cycle; true when there is none.
  def check(objdir = default_objdir, io = $stdout)
    g = graph(objdir)
    io.puts render(g)
    found = report(g)
    if found.empty?
      io.puts "ext/serval: no dependency cycle among #{g.size} modules"
      true
    else
      io.puts "ext/serval: #{found.size} dependency cycle(s):", *found
      false
    end
  end
end

exit(CDeps.check(*ARGV) ? 0 : 1) if $PROGRAM_NAME == __FILE__
