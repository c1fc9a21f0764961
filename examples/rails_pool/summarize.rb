# frozen_string_literal: true

# Mean, p50 and p99 of the timing fields of the access-log lines on stdin
# (serval --log-requests), in milliseconds:
#   grep "GET /sleep" serval.log | ruby examples/rails_pool/summarize.rb
rows = $stdin.each_line.map do |line|
  line.scan(/(\w+)=([\d.]+)/).to_h.transform_values(&:to_f)
end
abort "no lines" if rows.empty?
n = rows.size
%w[queue run idle stall cpu wait pool_wait].each do |key|
  values = rows.filter_map { |r| r[key] }.sort
  next if values.empty?

  printf("%-9s mean %7.1f  p50 %7.1f  p99 %7.1f ms\n", key, values.sum / values.size, values[values.size / 2],
         values[(values.size * 0.99).floor])
end
puts "#{n} requests"
