#!/usr/bin/env bash
# redis-server's and the server's CPU per decision on the Redis store, natively, for two builds in
# alternating rounds (issue 34; docs/performance.md "Plain compare-and-sets"): per round and build a
# fresh redis-server and server, 20,000 warm-up calls, then CALLS calls at SHAPE over KEYS through
# `load --drive`; CPU (user + system) of each process from /proc over those calls only.
#   A=/tmp/before/ratelimit-server B=target/release/ratelimit-server ROUNDS=3 \
#     scripts/issue34-probes/redis-cpu-ab.sh
#   LOAD=target/release/examples/load CALLS=100000 SHAPE=4x64 KEYS=100k-zipf
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${A:?the first build (a ratelimit-server binary)}
B=${B:-target/release/ratelimit-server}
LOAD=${LOAD:-target/release/examples/load}
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-100000}
SHAPE=${SHAPE:-4x64}
KEYS=${KEYS:-100k-zipf}
dir=$(mktemp -d)
mkdir -p "$dir/rules"
cat > "$dir/rules/load.yaml" <<'RULES'
domain: load
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
RULES
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system, clock ticks
hz=$(getconf CLK_TCK)
one() { # BIN -> "redis-server µs, server µs" per decision
  local rport grpc http rpid spid r0 s0 r1 s1
  rport=$(free_port); grpc=$(free_port); http=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no > "$dir/redis.log" 2>&1 & rpid=$!
  for _ in $(seq 300); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
  SHUTDOWN_DELAY=0s LOG_LEVEL=warn BACKEND_TYPE=redis REDIS_URL=127.0.0.1:$rport CACHE_KEY_PREFIX=load: \
    "$1" serve --config "$dir/rules" --grpc-addr 127.0.0.1:$grpc --http-addr 127.0.0.1:$http > "$dir/server.log" 2>&1 & spid=$!
  for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$http/healthcheck" && break; sleep 0.1; done
  "$LOAD" --drive 127.0.0.1:$grpc --calls 20000 --keys "$KEYS" --shapes "$SHAPE" > /dev/null
  r0=$(ticks $rpid); s0=$(ticks $spid)
  "$LOAD" --drive 127.0.0.1:$grpc --calls "$CALLS" --keys "$KEYS" --shapes "$SHAPE" > /dev/null
  r1=$(ticks $rpid); s1=$(ticks $spid)
  kill -TERM $spid; wait $spid || true
  redis-cli -p "$rport" shutdown nosave > /dev/null 2>&1 || true; wait $rpid || true
  python3 -c "import sys; hz,c=$hz,$CALLS; print(f'{($r1-$r0)*1e6/hz/c:.1f} {($s1-$s0)*1e6/hz/c:.1f}')"
}
echo "| round | build | redis-server CPU µs per decision | server CPU µs per decision | load average |"
echo "|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  for name in A B; do
    bin=${!name}
    read -r redis server < <(one "$bin")
    echo "| $r | $name | $redis | $server | $(cut -d' ' -f1 /proc/loadavg) |"
  done
done
