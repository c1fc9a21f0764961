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
# And the serving core knows no policy: every module is either core (serves
# requests), optional (measures or steers them, attached through
# ext/serval/hooks.h) or the extension's entry (serval_ext, which loads
# both), and no core module depends on an optional one, directly or through
# other modules. A new module must be put in one of the lists below.
#
#   ruby tasks/c_deps.rb [-v] [OBJDIR]   # OBJDIR: this Ruby's build under tmp/ by default
#
# prints the graph (-v: with the symbols and includes behind each edge) and
# exits 1 naming every cycle and its edges (rake c_deps, after compile).
module CDeps
  ROOT = File.expand_path("..", __dir__)
  SRC = File.join(ROOT, "ext/serval")

  # An edge A -> B and why: the symbols A uses from B, the files of A that include b.h.
  Edge = Struct.new(:symbols, :includes) do
    def why
      parts = []
      parts << "uses #{symbols.sort.first(4).join(', ')}#{symbols.size > 4 ? ", +#{symbols.size - 4}" : ''}" unless symbols.empty?
      parts << "#include in #{includes.sort.join(', ')}" unless includes.empty?
      parts.join("; ")
    end
  end

  # The modules that serve a request, and those that attach to them.
  CORE = %w[conn core env errlog hooks loop parser request serval serval_ruby tls transport].freeze
  OPTIONAL = %w[balance fairness gvl shed shed_core sim steadiness timing window winslot].freeze
  ENTRY = %w[serval_ext].freeze
  LAYERS = { core: CORE, optional: OPTIONAL, entry: ENTRY }.freeze

  module_function

  # This Ruby's objects, where rake-compiler builds them (tmp/PLATFORM/serval_ext/VERSION).
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
    undefs = Hash.new { |h, k| h[k] = [] }
    by_path = objects.to_h { |m, o| [o, m] }
    nm(objects.values).each do |path, symbol, defined|
      m = by_path.fetch(path)
      defined ? defs[symbol] = m : undefs[m] << symbol
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

  # The global symbols of the objects, in one run of nm: [object, symbol,
  # defined?] (U, and w/v, weak ones not defined here, are undefined).
  def nm(objects)
    out = IO.popen(["nm", "-A", "-g", "-P", *objects], &:read)
    raise "nm failed on #{objects.join(' ')}" unless $?.success?

    out.lines.map do |line|
      path, rest = line.split(": ", 2)
      symbol, type = rest.split
      [path, symbol, !%w[U w v].include?(type)]
    end
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

  # The graph as text: a line per module with what it depends on (and, when
  # verbose, a line per dependency saying why).
  def render(g, verbose: false)
    g.keys.sort.map do |m|
      deps = g[m].keys.sort
      lines = ["#{m} -> #{deps.empty? ? '-' : deps.join(' ')}"]
      lines.concat(deps.map { |d| "    #{d}: #{g[m][d].why}" }) if verbose
      lines.join("\n")
    end.join("\n")
  end

  # The lines naming each cycle and the edges inside it; empty when none.
  def report(g)
    cycles(g).map do |scc|
      edges = scc.flat_map { |a| g[a].keys.select { |b| scc.include?(b) }.sort.map { |b| "    #{a} -> #{b}: #{g[a][b].why}" } }
      ["cycle: #{scc.join(' ')}", *edges].join("\n")
    end
  end

  # The lines naming each way a core module depends on an optional one (with
  # the path, the first edge's reason) and each module in no layer; empty when
  # none. layers: {core:, optional:, entry:} lists of modules.
  def layering(g, layers)
    core, optional = layers.fetch(:core), layers.fetch(:optional)
    known = core + optional + layers.fetch(:entry, [])
    out = (g.keys - known).sort.map { |m| "module #{m} is in no layer (tasks/c_deps.rb CORE, OPTIONAL or ENTRY)" }
    core.select { |m| g.key?(m) }.sort.each do |from|
      parent = { from => nil }
      queue = [from]
      until queue.empty?
        m = queue.shift
        g[m].keys.sort.each do |d|
          next if parent.key?(d)

          parent[d] = m
          if optional.include?(d)
            path = [d]
            path.unshift(parent[path.first]) while parent[path.first]
            out << "core module #{from} depends on optional #{d}: #{path.join(' -> ')} (#{path[0]} -> #{path[1]}: " \
                   "#{g[path[0]][path[1]].why})"
          else
            queue << d
          end
        end
      end
    end
    out
  end

  # Prints the graph, then every cycle and every core module depending on an
  # optional one; true when there is neither. layers: as #layering (the
  # extension's own by default), or nil for no layer check.
  def check(objdir = default_objdir, io = $stdout, verbose: false, src: SRC, layers: (src == SRC ? LAYERS : nil))
    g = graph(objdir, src)
    io.puts render(g, verbose: verbose)
    found = report(g)
    ok = found.empty?
    if ok
      io.puts "ext/serval: no dependency cycle among #{g.size} modules"
    else
      io.puts "ext/serval: #{found.size} dependency cycle(s):", *found
    end
    return ok unless layers

    bad = layering(g, layers)
    if bad.empty?
      io.puts "ext/serval: no core module depends on an optional one"
    else
      io.puts "ext/serval: the core depends on optional modules:", *bad
    end
    ok && bad.empty?
  end
end

if $PROGRAM_NAME == __FILE__
  verbose = !ARGV.delete("-v").nil?
  exit(CDeps.check(*ARGV, verbose: verbose) ? 0 : 1)
end
