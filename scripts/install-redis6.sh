#!/usr/bin/env bash
# Installs redis-server 6.0 (Debian 11's 6.0.16) as `redis6-server`, for the test that a Redis too
# old for the compare-and-set's `SET … PXAT … GET` (before 6.2) stops start-up naming its version
# (tests/it/redis_start.rs). envoyproxy/ratelimit's users run such servers (its INCRBY and EXPIRE
# work on any). Debian 12 ships 7.0 only: this takes bullseye's package and the libraries it links
# that bookworm lacks or has newer, from Debian's own archive, unpacked under $PREFIX
# (scripts/unpack-debian-packages.sh: nothing of the system is installed or upgraded), and puts a
# `redis6-server` wrapper on the PATH.
#
# usage: scripts/install-redis6.sh      PREFIX=/opt/redis6 BIN=/usr/local/bin (as root)
set -euo pipefail
PREFIX=${PREFIX:-/opt/redis6}
BIN=${BIN:-/usr/local/bin}
if "$BIN/redis6-server" --version 2>/dev/null | grep -q 'v=6\.0\.'; then
  "$BIN/redis6-server" --version
  exit 0
fi
# redis-tools holds the server's binary (redis-check-rdb; redis-server is its other name, which
# it reads from argv[0]); then the libraries it links that bookworm does not have (OpenSSL 1.1,
# Lua 5.1 and the Lua modules Redis loads) or has in other versions.
bash "$(dirname "$0")/unpack-debian-packages.sh" bullseye "$PREFIX" redis-tools libssl1.1 \
  liblua5.1-0 lua-cjson lua-bitop libjemalloc2 liblzf1
ln -sf redis-check-rdb "$PREFIX/usr/bin/redis-server"
mkdir -p "$BIN"
cat > "$BIN/redis6-server" <<EOF
#!/bin/sh
# Debian 11's redis-server 6.0, run with its own libraries (scripts/install-redis6.sh).
LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu exec $PREFIX/usr/bin/redis-server "\$@"
EOF
chmod +x "$BIN/redis6-server"
"$BIN/redis6-server" --version
