# frozen_string_literal: true

# The child of Serval::Auto::ModelProcess: `ruby -I lib model_child.rb NICE [POLICY]`
# (POLICY idle, the default, or batch).
# Reads [kind, window, options] Marshal frames (4-byte big-endian length,
# then the data) on stdin, answers each with Auto::Model.call's result
# (kind :model), Serval::Advice.recommend's (kind :advice) or
# Serval::Advice::Local.recommend's (kind :local_advice: ModelProcess::KINDS), or
# {error: message}, in the same framing on stdout; exits at EOF.
# A frame [:file, path] (ModelProcess#submit) stands for the frame held in
# that file, which the parent wrote and removes.
require "serval/auto/model"
require "serval/auto/sample_table"
require "serval/advice"
require "serval/advice/local"

# :local_advice: Advice::Local's, facts read here (see ModelProcess::KINDS).
def local_advice(window, options)
  pids = Array(options.delete(:pids))
  Serval::Advice::Local.recommend(window, stats: { worker_status: pids.map { |pid| { pid: pid } } }, **options)
end

KINDS = {
  model: ->(window, options) { Serval::Auto::Model.call(window, **options) },
  advice: ->(window, options) { Serval::Advice.recommend(window, **options) },
  local_advice: ->(window, options) { local_advice(window, options) }
}.freeze

begin
  Process.setpriority(Process::PRIO_PROCESS, 0, Integer(ARGV[0] || 19))
rescue SystemCallError
  nil # not allowed: run at the inherited priority
end

# On Linux, also a scheduling policy for this thread, the one that runs the
# model. idle (SCHED_IDLE, 5: the advice log's and threads :auto's checks):
# a request thread that wakes while the model runs on the server's CPU
# takes the CPU at once, where at nice 19 alone it can wait for the end of
# the child's slice; the model runs only in the CPU time the server leaves.
# batch (SCHED_BATCH, 3: an advice someone asked for and waits for): a fair
# share of a busy CPU, so the answer comes in seconds, but never preempting
# a waking request thread. Through Fiddle (Ruby's own FFI); without it, or
# not allowed, the nice value alone stays.
POLICIES = { "idle" => 5, "batch" => 3 }.freeze

def scheduling_policy(name)
  return unless RUBY_PLATFORM.include?("linux")

  require "fiddle"
  set = Fiddle::Function.new(Fiddle::Handle::DEFAULT["sched_setscheduler"],
                             [Fiddle::TYPE_INT, Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)
  set.call(0, POLICIES.fetch(name, POLICIES["idle"]), [0].pack("i")) # sched_param { sched_priority = 0 }
rescue LoadError, StandardError
  nil
end
scheduling_policy(ARGV[1] || "idle")

# The model is a tight numeric loop: YJIT (Ruby 3.3+, when built in) runs it
# in about half the CPU time. Only this child, never the server.
RubyVM::YJIT.enable if defined?(RubyVM::YJIT) && RubyVM::YJIT.respond_to?(:enable) && !RubyVM::YJIT.enabled?
$stdin.binmode
$stdout.binmode

loop do
  head = $stdin.read(4)
  break if head.nil? || head.bytesize < 4

  data = $stdin.read(head.unpack1("N"))
  break if data.nil?

  answer = begin
    kind, window, options = Marshal.load(data) # rubocop:disable Security/MarshalLoad -- from the parent that started us
    kind, window, options = Marshal.load(File.binread(window)) if kind == :file # rubocop:disable Security/MarshalLoad
    window = Serval::Auto::SampleTable.unpack(window)
    KINDS.fetch(kind) { raise ArgumentError, "unknown kind #{kind.inspect}" }.call(window, options)
  rescue StandardError => e
    { error: "#{e.class}: #{e.message}" }
  end
  out = Marshal.dump(answer)
  $stdout.write([out.bytesize].pack("N"), out)
  $stdout.flush
end
