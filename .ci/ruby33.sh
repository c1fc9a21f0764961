#!/usr/bin/env bash
# Build Ruby 3.3 from Debian trixie's ruby3.3 source package, cached outside the
# checkout. Prints the install prefix on its last line. Reuses a finished build.
#
# Debian bookworm packages Ruby 3.1 only; no registry this project reaches ships
# a Ruby 3.3 binary for bookworm, so we build the trixie source package.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

CACHE="${SERVAL_CACHE:-/var/cache/serval}"
PREFIX="$CACHE/ruby-3.3"
if [ -x "$PREFIX/bin/ruby" ] && "$PREFIX/bin/ruby" -e 'exit(RUBY_VERSION.start_with?("3.3") ? 0 : 1)'; then
  echo "$PREFIX"
  exit 0
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

# deb-src for trixie, reusing the existing Debian source's URIs and key.
LIST=/etc/apt/sources.list.d/serval-trixie-src.sources
if [ ! -f "$LIST" ]; then
  main=/etc/apt/sources.list.d/debian.sources
  uris=$(grep -m1 '^URIs:' "$main")
  signed=$(grep -m1 '^Signed-By:' "$main")
  printf 'Types: deb-src\n%s\nSuites: trixie\nComponents: main\n%s\n' "$uris" "$signed" | $SUDO tee "$LIST" >/dev/null
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  gcc make bison autoconf dpkg-dev libssl-dev libyaml-dev zlib1g-dev libffi-dev libgmp-dev >/dev/null

WORK="$CACHE/src"
mkdir -p "$WORK"
cd "$WORK"
ls ruby3.3_*.dsc >/dev/null 2>&1 || apt-get source --download-only ruby3.3
tarball=$(ls ruby3.3_*.orig.tar.* | head -1)
rm -rf build && mkdir build
tar -xf "$tarball" -C build --strip-components=1
cd build
# Ruby's makefile downloads the bundled gems (minitest, test-unit, ...) from
# the network itself, outside any package client; build without them: the
# suite's gems come from `bundle install`.
sed -i '/^[^#[:space:]]/d' gems/bundled_gems

jit=()
command -v rustc >/dev/null && jit=(--enable-yjit)
./configure --prefix="$PREFIX" --disable-install-doc "${jit[@]}" >configure.log 2>&1 || { tail -40 configure.log; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { tail -60 make.log; exit 1; }
make install >install.log 2>&1 || { tail -40 install.log; exit 1; }
cd "$WORK" && rm -rf build
"$PREFIX/bin/ruby" -v >&2
echo "$PREFIX"
