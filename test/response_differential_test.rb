# frozen_string_literal: true

require "test_helper"
require "open3"
require "support/http_wire"
require "support/subprocess_server"
require "support/response_cases"

# The same Rack app (test/support/response_cases.rb) under Puma (bench/
# Gemfile's bundle, as bench/run uses it) and under Serval (exe/serval),
# the same raw request for each case on a fresh keep-alive connection,
# then GET /ping on that connection. Serval must answer each case at least
# as well as Puma: the same status class, and a framing at least as good
# (:ok a complete response and the connection usable or closed as
# announced; :closed the connection closed mid-way or unannounced, which a
# client sees as an error but never misreads; :broken a hang, bytes a
# client would misread, a desynchronised connection or an interim status
# as the final one). Where Serval refuses on purpose (refuses:) it answers
# a clean 500 and logs one line naming the cause. SERVAL_DIFF_VERBOSE=1
# prints the table.
class ResponseDifferentialTest < Minitest::Test
  include Serval::HttpWire
  include Serval::SubprocessHelpers

  ROOT = File.expand_path("..", __dir__)
  BENCH_GEMFILE = File.join(ROOT, "bench", "Gemfile")
  CASES_FILE = File.expand_path("support/response_cases.rb", __dir__)
  CONFIG_RU = "require #{CASES_FILE.dump}\nrun Serval::ResponseCases::APP\n"
  READ_TIMEOUT = 1.0 # a hang counts as :broken after this
  RANK = { ok: 2, closed: 1, broken: 0 }.freeze

  Outcome = Struct.new(:framing, :status, :response, :note, keyword_init: true)

  def bench_env
    { "BUNDLE_GEMFILE" => BENCH_GEMFILE, "RUBYOPT" => nil, "RACK_ENV" => nil, "APP_ENV" => nil, "RAILS_ENV" => nil }
  end

  # Puma from bench/Gemfile, or the reason it cannot run.
  def puma_missing
    out, status = Open3.capture2e(bench_env, "bundle", "exec", "puma", "--version", chdir: ROOT)
    status.success? ? nil : out.lines.last(3).join
  rescue SystemCallError => e
    e.message
  end

  def test_serval_answers_every_response_at_least_as_well_as_puma
    missing = puma_missing
    skip "Puma is not installed (BUNDLE_GEMFILE=bench/Gemfile bundle install; .ci/run does): #{missing}" if missing

    files = { "config.ru" => CONFIG_RU }
    puma = spawn_server(command: ["bundle", "exec", "puma", "-e", "development", "-w", "0", "-t", "4:4",
                                  "-b", "tcp://127.0.0.1:0", "config.ru"],
                        files: files, env: bench_env)
    serval = spawn_server(["-e", "development", "-t", "4:4", "-b", "tcp://127.0.0.1:0", "config.ru"],
                          files: files, env: { "RACK_ENV" => nil, "APP_ENV" => nil, "RAILS_ENV" => nil })
    [puma, serval].each(&:start)
    [puma, serval].each { |s| s.boot(timeout: 20) }

    cases = Serval::ResponseCases::CASES
    # the two servers in parallel, the cases one after another on each
    results = [puma, serval].map { |s| Thread.new { cases.to_h { |c| [c.name, exchange(s.port, c)] } } }.map(&:value)
    puma_results, serval_results = results
    report(cases, puma_results, serval_results) if ENV["SERVAL_DIFF_VERBOSE"]

    serval_log = wait_for_refusal_logs(serval, cases.select(&:refuses))
    cases.each { |c| check(c, puma_results[c.name], serval_results[c.name], serval_log) }
    # development: one warning per header name for the whole process (x-v is in many cases)
    assert_equal 1, serval_log.scan(/response header "x-v" has/).size, serval_log
    assert_equal 1, serval_log.scan(/response header name :x_sym is a Symbol/).size, serval_log
  end

  private

  # One case on a fresh connection, then /ping on the same connection.
  def exchange(port, kase)
    client = Client.new(port, timeout: READ_TIMEOUT)
    client.write(kase.request)
    res = begin
      client.read_response(head_request: kase.head?)
    rescue WireTimeout => e
      return Outcome.new(framing: :broken, note: "hang: #{e.message}")
    rescue EOFError, Errno::ECONNRESET => e
      return Outcome.new(framing: :closed, note: "closed mid-response: #{e.message[0, 80]}")
    rescue StandardError => e
      return Outcome.new(framing: :broken, note: "unreadable: #{e.class}: #{e.message[0, 80]}")
    end
    status_line = res.head[/\A[^\r]*/]
    unless status_line.match?(%r{\AHTTP/1\.[01] [1-5]\d\d(?: |\z)})
      return Outcome.new(framing: :broken, response: res, note: "bad status line #{status_line.inspect}")
    end
    if res.status < 200
      return Outcome.new(framing: :broken, status: res.status, response: res, note: "an interim status as the final")
    end

    Outcome.new(framing: after(client, kase, res), status: res.status, response: res)
  ensure
    client&.close
  end

  # What the connection does after a complete response.
  def after(client, kase, res)
    if announced_close?(kase, res)
      return client.closed_by_peer? ? :ok : :broken # bytes after the end
    end

    client.write("GET /ping HTTP/1.1\r\nHost: diff.test\r\n\r\n")
    ping = client.read_response
    ping.status == 200 && ping.body == "pong" ? :ok : :broken
  rescue WireTimeout
    :broken
  rescue EOFError, SystemCallError
    :closed
  rescue StandardError
    :broken
  end

  def announced_close?(kase, res)
    return true if res["connection"]&.casecmp?("close")
    return !res["connection"]&.casecmp?("keep-alive") if kase.version == "1.0"

    bodyless = kase.head? || [204, 304].include?(res.status)
    !bodyless && res["content-length"].nil? && !res["transfer-encoding"]&.casecmp?("chunked") # close-delimited
  end

  def wait_for_refusal_logs(serval, refusing)
    serval.wait_for_count(/Serval::BadResponse/, refusing.size, stream: :err, timeout: 5)
    serval.stderr
  rescue RuntimeError
    serval.stderr # the assertions below say which one is missing
  end

  def check(kase, puma, serval, serval_log)
    label = "#{kase.name}: Puma #{summary(puma)} / Serval #{summary(serval)}"
    if kase.refuses
      assert_equal [:ok, 500], [serval.framing, serval.status], "#{label}: a clean 500 expected"
      lines = serval_log.lines.grep(%r{GET #{Regexp.escape(kase.path)}: Serval::BadResponse})
      assert_equal 1, lines.size, "#{label}: one log line for the cause:\n#{serval_log}"
      assert_match kase.refuses, lines.first, label
      return
    end
    if kase.gap
      refute_equal :broken, serval.framing, "#{label} (a known gap: #{kase.gap})"
      return
    end

    assert_operator RANK[serval.framing], :>=, RANK[puma.framing], "#{label}: framing worse than Puma's"
    if puma.framing == :ok
      assert_equal puma.status / 100, serval.status.to_i / 100, "#{label}: another status class"
      assert_equal puma.response.body, serval.response.body, "#{label}: another body" if puma.status < 300
    end
    kase.same.each do |name|
      assert_equal puma.response.values(name), serval.response.values(name), "#{label}: header #{name}"
    end
  end

  def summary(outcome)
    return "-" unless outcome

    [outcome.status || "no status", outcome.framing, outcome.note].compact.join(" ")
  end

  def report(cases, puma_results, serval_results)
    width = cases.map { |c| c.name.size }.max
    $stdout.puts "\n#{'case'.ljust(width)}  #{'puma'.ljust(40)}  serval"
    cases.each do |c|
      $stdout.puts "#{c.name.ljust(width)}  #{summary(puma_results[c.name])[0, 40].ljust(40)}  #{summary(serval_results[c.name])[0, 60]}"
    end
  end
end
