# frozen_string_literal: true

# The child of Serval::Auto::ModelProcess: `ruby -I lib model_child.rb NICE`.
# Reads [kind, window, options] Marshal frames (4-byte big-endian length,
# then the data) on stdin, answers each with Auto::Model.call's result
# (kind :model) or Serval::Advice.recommend's (kind :advice), or
# {error: message}, in the same framing on stdout; exits at EOF.
require "serval/auto/model"
require "serval/advice"

KINDS = {
  model: ->(window, options) { Serval::Auto::Model.call(window, **options) },
  advice: ->(window, options) { Serval::Advice.recommend(window, **options) }
}.freeze

begin
  Process.setpriority(Process::PRIO_PROCESS, 0, Integer(ARGV[0] || 19))
rescue SystemCallError
  nil # not allowed: run at the inherited priority
end

# On Linux, also the idle scheduling policy (SCHED_IDLE, 5) for this thread,
# the one that runs the model: a request thread that wakes while the model
# runs on the server's CPU takes the CPU at once, where at nice 19 alone it
# can wait for the end of the child's slice. Through Fiddle (Ruby's own FFI);
# without it, or not allowed, nice 19 stays.
def idle_policy
  return unless RUBY_PLATFORM.include?("linux")

  require "fiddle"
  set = Fiddle::Function.new(Fiddle::Handle::DEFAULT["sched_setscheduler"],
                             [Fiddle::TYPE_INT, Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)
  set.call(0, 5, [0].pack("i")) # sched_param { sched_priority = 0 }
rescue LoadError, StandardError
  nil
end
idle_policy

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
    KINDS.fetch(kind) { raise ArgumentError, "unknown kind #{kind.inspect}" }.call(window, options)
  rescue StandardError => e
    { error: "#{e.class}: #{e.message}" }
  end
  out = Marshal.dump(answer)
  $stdout.write([out.bytesize].pack("N"), out)
  $stdout.flush
end
