#!/usr/bin/env bash
# The Rails leg: examples/rails (Rails 8.1 on PostgreSQL) booted under Serval
# on Ruby 3.3 and checked over real HTTP by test/rails/rails_integration.rb
# (docs/rails.md). Installs and starts Debian's PostgreSQL when needed,
# creates the app's role, compiles Serval for this Ruby, bundles the app,
# prepares its database, then runs the test.
#
#   bash .ci/rails.sh          # everything (what .ci/run does)
#   bash .ci/rails.sh setup    # everything but the test (for bench/run rails)
#
# RUBY33=PREFIX picks the Ruby (default: the one .ci/ruby33.sh builds).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
what="${1:-all}"
t0=$(date +%s)
step() { echo "== rails leg: $* ($(($(date +%s) - t0)) s)"; }

prefix="${RUBY33:-$(bash .ci/ruby33.sh | tail -n 1)}"
export PATH="$prefix/bin:$PATH"
# Every lockfile names Ruby 3.3's own Bundler (2.5.22): no BUNDLE_VERSION needed.
unset BUNDLE_VERSION
unset BUNDLE_GEMFILE RUBYOPT

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}

step "PostgreSQL"
if ! ls /etc/postgresql/*/main/postgresql.conf >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq postgresql >/dev/null
fi
pg_version=$(ls /etc/postgresql | sort -V | tail -n 1)
$SUDO pg_ctlcluster "$pg_version" main status >/dev/null 2>&1 || $SUDO pg_ctlcluster "$pg_version" main start
for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 && break; sleep 0.5; done
pg_isready -h 127.0.0.1
# The app's role (config/database.yml: serval_demo / serval_demo, CREATEDB so
# that db:prepare creates its database).
if [ "$(as_postgres psql -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'serval_demo'")" != 1 ]; then
  as_postgres psql -qc "CREATE ROLE serval_demo LOGIN CREATEDB PASSWORD 'serval_demo'"
fi

step "Serval's extension for $(ruby -e 'print RUBY_VERSION')"
bundle install --jobs 2 --retry 2 --quiet
rm -f lib/serval/serval_ext.so
bundle exec rake compile >/dev/null

step "examples/rails bundle"
(cd examples/rails && bundle install --jobs 2 --retry 2 --quiet)

step "examples/rails database (production)"
SECRET_KEY_BASE="${SECRET_KEY_BASE:-$(ruby -rsecurerandom -e 'print SecureRandom.hex(64)')}"
export SECRET_KEY_BASE
# db:prepare creates the database and loads db/schema.rb (the app's tables,
# Solid Queue's and job_runs), or migrates an existing one to it; db:seed
# too: idempotent, and an existing database gets its 10 rows for /db.
(cd examples/rails && RAILS_ENV=production bin/rails db:prepare db:seed)

if [ "$what" = setup ]; then
  step "setup done"
  exit 0
fi

step "test/rails/rails_integration.rb"
# Each test is bounded (SERVAL_TEST_TIMEOUT, test/test_helper.rb); a test
# that boots a server or sends 150 MB gets more than the suite's default.
export SERVAL_TEST_TIMEOUT="${SERVAL_RAILS_TEST_TIMEOUT:-120}"
timeout --signal=TERM --kill-after=20 480 bundle exec ruby -w -Ilib -Itest test/rails/rails_integration.rb
step "done"
