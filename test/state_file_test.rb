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
