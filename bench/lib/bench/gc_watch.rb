# frozen_string_literal: true

# Preloaded into a server (ruby -r bench/lib/bench/gc_watch.rb ...) by
# bench/gc_runs: a thread writes to $GC_WATCH a line whenever GC.stat's
# count moved (checked every 20 ms: time, count, majors, GC ms, live and old
# slots, the last major's cause, threads, objects allocated, eden pages), and
# to $GC_WATCH.heap every 5 s each heap's pages, slots, forced majors and
# allocations (GC.stat_heap, Ruby 3.2+).
path = ENV.fetch("GC_WATCH")
Thread.new do
  f = File.open(path, "w")
  f.sync = true
  last = nil
  loop do
    s = GC.stat
    now = [s[:count], s[:major_gc_count]]
    if now != last
      f.puts format("%.3f count %d major %d time %d live %d old %d by %s threads %d alloc %d pages %d",
                    Process.clock_gettime(Process::CLOCK_REALTIME), s[:count], s[:major_gc_count], s[:time].to_i,
                    s[:heap_live_slots], s[:old_objects], GC.latest_gc_info(:major_by).inspect, Thread.list.size,
                    s[:total_allocated_objects], s[:heap_eden_pages])
      last = now
    end
    sleep 0.02
  end
end
if GC.respond_to?(:stat_heap)
  Thread.new do
    f = File.open("#{path}.heap", "w")
    f.sync = true
    loop do
      sleep 5
      f.puts format("%.1f ", Process.clock_gettime(Process::CLOCK_REALTIME)) + GC.stat_heap.map { |_, h|
        "#{h[:slot_size]}:p#{h[:heap_eden_pages]}/s#{h[:heap_eden_slots]}/f#{h[:force_major_gc_count]}/a#{h[:total_allocated_objects]}"
      }.join(" ")
    end
  end
end
