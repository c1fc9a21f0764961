# frozen_string_literal: true

require_relative "../test_helper"
require "etc"
require "tmpdir"
require "serval/advice"

# Machine facts from fixture trees (test/fixtures/cgroup/*): cgroup v1 and
# v2 CPU quotas and memory limits, affinity, MemAvailable, smaps_rollup.
class AdviceMachineTest < Minitest::Test
  FIXTURES = File.expand_path("../fixtures/cgroup", __dir__)
  GIB = 1 << 30

  def machine(name) = Serval::Advice::Machine.new(root: File.join(FIXTURES, name))

  # [fixture, usable CPUs, quota, affinity, source prefix, memory budget, memory source]
  CASES = [
    ["v2_limited", 1.5, 1.5, 8, "cgroup v2 cpu.max", 2 * GIB, "cgroup v2 memory.max"],
    ["v2_unlimited", 5.0, nil, 5, "sched affinity", 1_048_576 * 1024, "/proc/meminfo MemAvailable"],
    ["v1_limited", 2.0, 2.0, 16, "cgroup v1 cpu.cfs_quota_us", GIB, "cgroup v1 memory.limit_in_bytes"],
    ["v1_unlimited", 1.0, nil, 1, "sched affinity", 4_096_000 * 1024, "/proc/meminfo MemAvailable"]
  ].freeze

  CASES.each do |name, usable, quota, affinity, source, budget, msource|
    define_method("test_#{name}") do
      m = machine(name)
      cpus = m.cpus
      assert_in_delta usable, cpus[:usable], 1e-9
      quota ? assert_in_delta(quota, cpus[:quota], 1e-9) : assert_nil(cpus[:quota])
      assert_equal affinity, cpus[:affinity]
      assert cpus[:source].start_with?(source), cpus[:source]
      mem = m.memory
      assert_equal budget, mem[:budget]
      assert_equal msource, mem[:source]
      assert_equal({ cpus: cpus[:usable], cpu_source: cpus[:source], memory_bytes: budget, memory_source: msource },
                   m.to_h)
    end
  end

  def test_nested_v2_limits_take_the_smallest_along_the_path
    # the leaf allows 2.5 CPUs and 4 GiB, its parent 1.5 and 2 GiB
    assert_in_delta 1.5, machine("v2_limited").cpus[:quota], 1e-9
    assert_equal 2 * GIB, machine("v2_limited").memory[:limit]
  end

  def test_quota_above_affinity_uses_affinity
    Dir.mktmpdir do |root|
      FileUtils.cp_r(File.join(FIXTURES, "v1_limited/."), root)
      File.write(File.join(root, "proc/self/status"), "Cpus_allowed_list:\t3\n")
      cpus = Serval::Advice::Machine.new(root: root).cpus
      assert_in_delta 1.0, cpus[:usable], 1e-9
      assert_in_delta 2.0, cpus[:quota], 1e-9
      assert_equal "sched affinity (Cpus_allowed_list 3: 1)", cpus[:source], "the list as the kernel gives it, then the count"
    end
  end

  def test_smaps_rollup_pss_and_uss
    mem = machine("v1_unlimited").process_memory(4242)
    assert_equal 120_000 * 1024, mem[:pss]
    assert_equal (10_000 + 80_000 + 2048) * 1024, mem[:uss]
    assert_nil machine("v1_unlimited").process_memory(1)
  end

  def test_missing_files_fall_back_to_etc_nprocessors
    Dir.mktmpdir do |root|
      m = Serval::Advice::Machine.new(root: root)
      assert_equal Etc.nprocessors, m.cpus[:affinity]
      assert_nil m.cpus[:quota]
      assert_nil m.memory[:budget]
    end
  end

  def test_garbage_files_do_not_raise
    Dir.mktmpdir do |root|
      FileUtils.mkdir_p(File.join(root, "sys/fs/cgroup"))
      FileUtils.mkdir_p(File.join(root, "proc/self"))
      File.write(File.join(root, "sys/fs/cgroup/cgroup.controllers"), "cpu memory\n")
      File.write(File.join(root, "sys/fs/cgroup/cpu.max"), "banana\n")
      File.write(File.join(root, "sys/fs/cgroup/memory.max"), "lots\n")
      File.write(File.join(root, "proc/self/cgroup"), "0::/\n")
      m = Serval::Advice::Machine.new(root: root)
      assert_nil m.cpus[:quota]
      assert_nil m.memory[:limit]
    end
  end

  def test_this_machine_reads_without_error
    facts = Serval::Advice::Machine.new.to_h
    assert_operator facts[:cpus], :>=, 1
    assert_operator facts[:cpus], :<=, Etc.nprocessors
  end
end
