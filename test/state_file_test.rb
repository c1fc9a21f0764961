# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "serval/state_file"

# The state file holds the control token: it must stay private, and files or
# symlinks planted beside it must not read it or redirect the write.
class StateFileTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("serval-state-")
    @path = File.join(@dir, "serval.state")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_written_with_mode_0600_whatever_the_umask
    old = File.umask(0o000)
    Serval::StateFile.new(@path).write(pid: 1, control_auth_token: "secret")
    assert_equal 0o600, File.stat(@path).mode & 0o777
    assert_equal({ "pid" => 1, "control_auth_token" => "secret" }, Serval::StateFile.new(@path).read)
  ensure
    File.umask(old)
  end

  # The old temp name was PATH.PID.tmp: a world-readable file planted there
  # was reused (O_TRUNC keeps its mode) and a symlink there was followed.
  def test_planted_temp_names_are_neither_reused_nor_followed
    victim = File.join(@dir, "victim")
    File.write(victim, "precious")
    planted = "#{@path}.#{Process.pid}.tmp"
    File.symlink(victim, planted)
    readable = "#{@path}.readable.tmp"
    File.write(readable, "")
    File.chmod(0o644, readable)

    Serval::StateFile.new(@path).write(pid: Process.pid, control_auth_token: "secret")

    assert_equal "precious", File.read(victim), "the symlink's target was overwritten"
    assert_equal "", File.read(readable)
    assert_equal 0o600, File.stat(@path).mode & 0o777
    assert_equal "secret", Serval::StateFile.new(@path).read["control_auth_token"]
    leftovers = Dir.children(@dir).grep(/\.tmp\z/).sort
    assert_equal [File.basename(planted), File.basename(readable)].sort, leftovers, "no temp file of ours is left"
  end

  # The default (StateFile.with_default): the app's tmp/serval.state when a
  # control app is on and tmp/ exists; never a directory created.
  def test_default_path_under_an_existing_tmp
    options = { control_url: "unix://ctl.sock", directory: @dir, sources: {} }.freeze
    assert_same options, Serval::StateFile.with_default(options), "no tmp/: unchanged"
    refute Dir.exist?(File.join(@dir, "tmp")), "tmp/ is not created"

    Dir.mkdir(File.join(@dir, "tmp"))
    with = Serval::StateFile.with_default(options)
    assert_equal File.join(@dir, "tmp", "serval.state"), with[:state_path]
    assert_equal "default (tmp/serval.state)", with[:sources][:state_path]
    assert with.frozen?

    given = options.merge(state_path: "run/x.state")
    assert_same given, Serval::StateFile.with_default(given), "state_path wins"
    no_control = options.merge(control_url: nil)
    assert_same no_control, Serval::StateFile.with_default(no_control), "nothing to find without a control app"
    Dir.chdir(@dir) do
      assert_equal File.join(Dir.pwd, "tmp", "serval.state"), Serval::StateFile.with_default(control_url: "x")[:state_path],
                   "without directory: the current one"
    end
  end

  def test_default_path_skipped_when_tmp_is_not_writable
    skip "root writes anywhere" if Process.uid.zero?
    tmp = File.join(@dir, "tmp")
    Dir.mkdir(tmp, 0o500)
    options = { control_url: "unix://ctl.sock", directory: @dir }
    assert_nil Serval::StateFile.with_default(options)[:state_path]
  ensure
    File.chmod(0o700, tmp) if tmp && Dir.exist?(tmp)
  end

  # A symlink at the state path itself is replaced by the rename, its target untouched.
  def test_symlink_at_the_state_path_is_replaced_not_followed
    victim = File.join(@dir, "victim")
    File.write(victim, "precious")
    File.symlink(victim, @path)
    Serval::StateFile.new(@path).write(pid: 2, control_auth_token: "t")
    assert_equal "precious", File.read(victim)
    refute File.symlink?(@path)
    assert_equal 0o600, File.stat(@path).mode & 0o777
  end
end
