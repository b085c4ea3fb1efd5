#!/usr/bin/env bash
# Installs valkey-server 8.1 (a server with `SET … IFEQ … GET`) for the tests of the Redis store's
# conditional SET (tests/it/valkey.rs, crates/redis's cas tests) on a Debian 12 (bookworm) machine,
# which ships no Valkey with it (bookworm-backports has 8.0, without IFEQ). It takes Debian 13's
# (trixie's) package and the libraries it links, from Debian's own archive, unpacked beside the
# system under $PREFIX (scripts/unpack-debian-packages.sh: nothing of the system is upgraded;
# trixie's glibc stays in $PREFIX and the server runs through trixie's dynamic loader), and puts a
# `valkey-server` wrapper on the PATH.
#
# usage: scripts/install-valkey.sh      PREFIX=/opt/valkey BIN=/usr/local/bin (as root)
set -euo pipefail
PREFIX=${PREFIX:-/opt/valkey}
BIN=${BIN:-/usr/local/bin}
if "$BIN/valkey-server" --version 2>/dev/null | grep -q 'v=\(8\.[1-9]\|9\|[1-9][0-9]\)'; then
  "$BIN/valkey-server" --version
  exit 0
fi
# valkey-tools holds the server's binary (valkey-check-rdb; valkey-server is its other name);
# then the libraries it and they link (valkey-tools' Depends, and libsystemd0's).
bash "$(dirname "$0")/unpack-debian-packages.sh" trixie "$PREFIX" valkey-tools libc6 libjemalloc2 \
  liblzf1 libssl3t64 libsystemd0 libatomic1 libcap2 libzstd1 liblz4-1 liblzma5 libgcrypt20 \
  libgpg-error0 libstdc++6 libgcc-s1
lib=$PREFIX/usr/lib/x86_64-linux-gnu
mkdir -p "$BIN"
cat > "$BIN/valkey-server" <<EOF
#!/bin/sh
# Debian 13's valkey-server, run with its own libraries (scripts/install-valkey.sh).
exec $lib/ld-linux-x86-64.so.2 --library-path $lib --argv0 valkey-server $PREFIX/usr/bin/valkey-check-rdb "\$@"
EOF
chmod +x "$BIN/valkey-server"
"$BIN/valkey-server" --version
