#!/usr/bin/env bash
# Peak memory (VmHWM, /proc/PID/status) of the release server under examples/load, for the
# resource requests and limits of deploy/kubernetes (its README, "Resources"). The load tool
# starts the server once per scenario through a wrapper that records its PID; a poller reads each
# PID's VmHWM every 0.2 s until the process is gone, and is stopped by its PID (trap) at the end.
#
# usage: scripts/measure-rss.sh [examples/load arguments…]
#   default: --duration 2 --rounds 1 --keys 1,100k-zipf,1m-uniform --shapes 1x16,4x64,4x512
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin ratelimit-server --example load
work=$(mktemp -d)
cat >"$work/server" <<WRAP
#!/bin/sh
echo \$\$ >>"$work/pids"
exec "$PWD/target/release/ratelimit-server" "\$@"
WRAP
chmod +x "$work/server"
touch "$work/pids"
poll() {
  declare -A hwm
  while true; do
    while read -r pid; do
      v=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      if [ -n "$v" ]; then hwm[$pid]=$v; fi
    done <"$work/pids"
    for p in "${!hwm[@]}"; do echo "$p ${hwm[$p]}"; done >"$work/hwm"
    sleep 0.2
  done
}
poll &
poller=$!
trap 'kill "$poller" 2>/dev/null || true; rm -rf "$work"' EXIT
if [ $# -eq 0 ]; then
  set -- --duration 2 --rounds 1 --keys 1,100k-zipf,1m-uniform --shapes 1x16,4x64,4x512
fi
target/release/examples/load --server-bin "$work/server" "$@" | grep -E '^\| [^-]' | grep -v noop
sleep 0.5
echo "peak VmHWM per server process, in start order (one per scenario):"
while read -r pid; do
  awk -v p="$pid" '$1 == p {printf "  %.1f MiB\n", $2 / 1024}' "$work/hwm"
done <"$work/pids"
sort -k2 -n "$work/hwm" | tail -1 | awk '{printf "largest: %.1f MiB\n", $2 / 1024}'
