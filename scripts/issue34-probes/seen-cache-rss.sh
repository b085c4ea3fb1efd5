#!/usr/bin/env bash
# The Redis store's resident memory once its seen-value cache is full: a redis-server of its own,
# the server on it, then 3 × 200,000 ShouldRateLimit calls over 1M uniform keys (4×64, the cache
# holds 65,536), VmRSS and RssAnon read from /proc after each batch.
#
# usage: scripts/issue34-probes/seen-cache-rss.sh [ratelimit-server binary] (default: the release build)
#   e.g. A/B: run it once with each build (the earlier one copied aside first).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/ratelimit-server}
LOAD=target/release/examples/load
[ -x "$LOAD" ] || cargo build --release --example load
work=$(mktemp -d)
mkdir -p "$work/rules"
cat > "$work/rules/load.yaml" <<RULES
domain: load
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
RULES
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port); grpc=$(free_port); http=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no > "$work/redis.log" 2>&1 &
redis_pid=$!
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  redis-cli -p "$redis_port" shutdown nosave > /dev/null 2>&1 || kill "$redis_pid" 2>/dev/null
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$redis_port" ping > /dev/null 2>&1 && break; sleep 0.1; done
SHUTDOWN_DELAY=0s LOG_LEVEL=warn BACKEND_TYPE=redis REDIS_URL="127.0.0.1:$redis_port" CACHE_KEY_PREFIX=load: \
  "$BIN" serve --config "$work/rules" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" > "$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$http/healthcheck" && break; sleep 0.1; done
memory() { awk '/^(VmRSS|RssAnon)/ {printf "%s %.1f MiB  ", $1, $2 / 1024}' "/proc/$server_pid/status"; echo; }
echo "started:            $(memory)"
for batch in 1 2 3; do
  "$LOAD" --drive "127.0.0.1:$grpc" --calls 200000 --keys 1m-uniform --shapes 4x64 > /dev/null
  echo "after $((batch * 200))k calls: $(memory)"
done
