# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "rbconfig"

# Requiring Serval patches nothing: in a fresh process, after the libraries
# Serval itself requires (the standard library, Rack: their own changes to
# core classes are theirs), requiring every file under lib/serval leaves
# every class and module that existed before as it was: its ancestors, its
# singleton class's ancestors (Process.singleton_class: no _fork wrapper),
# its own methods. Features that must patch do it when they start
# (Serval::ForkHook, the control app and the agent-check).
class NoPatchesTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  SCRIPTS = %w[lib/serval/auto/model_child.rb].freeze # runs a loop on stdin when loaded

  PROBE = <<~'RUBY'
    root = ARGV.fetch(0)
    files = Dir[File.join(root, "lib/serval.rb"), File.join(root, "lib/serval/**/*.rb")].sort
    files -= ARGV.drop(1).map { |f| File.join(root, f) }
    files.flat_map { |f| File.read(f).scan(/^\s*require "([^"#]+)"/).flatten }.uniq
         .reject { |lib| lib.start_with?("serval") }.each do |lib|
      require lib
    rescue LoadError
      nil # optional (puma when absent): the serval file that needs it is skipped below too
    end

    def shape(mod)
      single = mod.singleton_class
      [mod.ancestors, single.ancestors, mod.instance_methods(false).sort, mod.private_instance_methods(false).sort,
       single.instance_methods(false).sort, single.private_instance_methods(false).sort]
    rescue StandardError, NotImplementedError
      nil
    end

    # Serval's own namespace may exist already (the gemspec loads its version)
    ours = ->(mod) { mod.inspect.match?(/\A(#<Class:)?Serval(::|>|\z)/) }
    before = ObjectSpace.each_object(Module).reject(&ours).to_h { |mod| [mod, shape(mod)] }
    loaded = files.count do |file|
      require file
      true
    rescue LoadError => e
      warn "skipped #{file}: #{e.message}"
      false
    end
    changed = before.filter_map do |mod, was|
      now = shape(mod)
      "#{mod.inspect}: #{(now.zip(was).find { |a, b| a != b }).inspect}" unless now == was
    end
    puts "loaded #{loaded} of #{files.size}"
    puts changed
    exit(changed.empty? ? 0 : 1)
  RUBY

  def test_requiring_every_file_changes_no_existing_class
    env = { "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile") }
    out, err, status = Open3.capture3(env, RbConfig.ruby, "-rbundler/setup", "-I", File.join(ROOT, "lib"), "-e", PROBE,
                                      ROOT, *SCRIPTS)
    count = Dir[File.join(ROOT, "lib/serval/**/*.rb")].size + 1 - SCRIPTS.size
    assert_match(/\Aloaded #{count} of #{count}\n/, out, err)
    assert status.success?, "changed by a require:\n#{out}#{err}"
    refute_match(/_fork|ForkHook/, out)
  end

  # The fork hook is installed when a feature that needs it starts, and then
  # closes that feature's listeners in any forked child (control_app_test,
  # agent-check tests); until then Process is untouched.
  def test_the_fork_hook_installs_only_when_a_feature_registers
    script = <<~'RUBY'
      require "serval/fork_hook"
      before = Process.singleton_class.ancestors
      abort "installed at require" if Serval::ForkHook.installed?
      r, w = IO.pipe
      Serval::ForkHook.on_child(:probe) { w.write("child ran it\n") }
      abort "not installed" unless Serval::ForkHook.installed?
      abort "no wrapper" unless Process.singleton_class.ancestors.size == before.size + 1
      Serval::ForkHook.on_child(:probe) { w.write("replaced\n") } # one block per key, one wrapper
      pid = fork { exit!(0) }
      Process.wait(pid)
      w.close
      puts r.read
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", script)
    assert status.success?, err
    assert_equal "replaced\n", out
  end
end
