#!/usr/bin/env bash
# redis-server's instructions per compare-and-set (callgrind), for the script as the store sends
# it and for what it is made of (issue 34; docs/cost-per-decision.md "Redis store"):
#   scripts/issue34-probes/redis-script-cost.sh            # new and base at 1, 4, 32 per call; nop; plain
#   N=20000 scripts/issue34-probes/redis-script-cost.sh new 4 16   # MODE PER PIPE
#   MISMATCH=0.1 scripts/issue34-probes/redis-script-cost.sh base 1  # 10 % sent expecting a stale value
#   FRESH=1 scripts/issue34-probes/redis-script-cost.sh nx 1       # keys never written, SET … NX … GET
# new: the script of the worktree's cas.rs; base: that of BASE (a revision, default main); old: a88ec0c.
# Each run: redis-server under callgrind, N compare-and-sets (100k zipf keys), less a run with none.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-20000}
dir=$(mktemp -d)
lua() { # the SCRIPT constant of cas.rs at revision $1 (worktree if empty)
  if [ -z "$1" ]; then cat crates/redis/src/cas.rs; else git show "$1:crates/redis/src/cas.rs"; fi |
    python3 -c 'import sys; s=sys.stdin.read(); a=s.index("const SCRIPT: &str = r\"")+24; print(s[a:s.index("\";", a)])'
}
lua "" > "$dir/new.lua"; lua "${BASE:-main}" > "$dir/base.lua"; lua a88ec0c > "$dir/old.lua"
one() { # MODE CALLS PER PIPE -> total instructions
  local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$1.$2.$3" redis-server --port "$port" --save '' --appendonly no > /dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 300); do redis-cli -p "$port" ping > /dev/null 2>&1 && break; sleep 0.1; done
  LUA="$dir/$1.lua" python3 scripts/issue34-probes/redis_script_drive.py "$port" "$1" "$2" "$3" "$4"
  redis-cli -p "$port" shutdown nosave > /dev/null 2>&1 || true; wait $pid || true
  callgrind_annotate "$dir/cg.$1.$2.$3" | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'
}
run() { local base full; base=$(one "$1" 0 "$2" "$3"); full=$(one "$1" "$N" "$2" "$3")
  echo "$1, $2 per call, $3 calls per write: $(( (full - base) / N )) instructions per compare-and-set"; }
if [ $# -gt 0 ]; then run "$1" "${2:-1}" "${3:-64}"; exit; fi
run new 1 64; run new 4 16; run new 32 2; run base 1 64; run base 4 16; run base 32 2; run nop 1 64; run plain 1 64
