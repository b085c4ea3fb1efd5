#!/usr/bin/env bash
# A Sentinel failover under load, from outside: a master, its replica and one Sentinel
# (redis-server, free ports), the release server on them (REDIS_TYPE=sentinel), `load --drive`
# calls at 1x16 over 100k zipf keys for 6 s with `SENTINEL FAILOVER` at 2 s; then what the server
# counted: decisions answered by the failure mode, Redis errors by kind, whether it said the master
# moved. Every process is stopped on exit.
#
# usage: scripts/sentinel-failover-under-load.sh [BIN] [RUNS]
#   BIN=target/release/ratelimit-server RUNS=1; build first:
#   cargo build --release --bin ratelimit-server --example load
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/ratelimit-server}
RUNS=${2:-1}
LOAD=target/release/examples/load
for f in "$BIN" "$LOAD"; do
  [ -x "$f" ] || { echo "missing $f: cargo build --release --bin ratelimit-server --example load" >&2; exit 2; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

one() {
  local m r s g h run=$1; m=$(free_port); r=$(free_port); s=$(free_port); g=$(free_port); h=$(free_port)
  local d="$dir/$run"; mkdir -p "$d/rules"
  cat > "$d/rules/load.yaml" <<'RULES'
domain: load
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
RULES
  printf 'port %s\nsentinel monitor mymaster 127.0.0.1 %s 1\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n' \
    "$s" "$m" > "$d/sentinel.conf"
  redis-server --port "$m" --bind 127.0.0.1 --save '' --appendonly no --dir "$d" > "$d/master.log" 2>&1 & pids+=($!)
  redis-server --port "$r" --bind 127.0.0.1 --save '' --appendonly no --dir "$d" --replicaof 127.0.0.1 "$m" > "$d/replica.log" 2>&1 & pids+=($!)
  redis-server "$d/sentinel.conf" --sentinel > "$d/sentinel.log" 2>&1 & pids+=($!)
  for _ in $(seq 300); do
    redis-cli -p "$r" INFO replication 2>/dev/null | grep -q 'master_link_status:up' &&
      redis-cli -p "$s" SENTINEL replicas mymaster 2>/dev/null | grep -q "^$r\$" && break
    sleep 0.1
  done
  SHUTDOWN_DELAY=0s LOG_LEVEL=info BACKEND_TYPE=redis REDIS_TYPE=sentinel REDIS_URL="mymaster,127.0.0.1:$s" \
    "$BIN" serve --config "$d/rules" --grpc-addr "127.0.0.1:$g" --http-addr "127.0.0.1:$h" > "$d/server.log" 2>&1 &
  local server=$!; pids+=($server)
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$h/healthcheck" && break; sleep 0.1; done
  "$LOAD" --drive "127.0.0.1:$g" --calls 10000000 --keys 100k-zipf --shapes 1x16 > "$d/load.log" 2>&1 &
  local load=$!
  sleep 2
  redis-cli -p "$s" SENTINEL FAILOVER mymaster > "$d/failover.out"
  sleep 4
  local master; master=$(redis-cli -p "$s" SENTINEL get-master-addr-by-name mymaster | tail -1)
  kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true
  local page; page=$(curl -s "http://127.0.0.1:$h/metrics")
  local moved; moved=$(grep -c 'master moved' "$d/server.log" || true)
  echo "run $run: failover $(cat "$d/failover.out"), master now :$master (was :$m); Redis calls $(grep -E '^ratelimit_redis_calls ' <<< "$page" | cut -d' ' -f2), failure-mode decisions $(grep -E '^ratelimit_store_failure_mode_decisions' <<< "$page" | awk '{s+=$2} END {print s+0}'), Redis errors $(grep -E '^ratelimit_redis_errors' <<< "$page" | awk '{s+=$2} END {print s+0}') ($(grep -E '^ratelimit_redis_errors' <<< "$page" | awk '$2>0 {printf "%s ", $0}')), 'master moved' logged $moved time(s)"
  cleanup; pids=()
}

for run in $(seq "$RUNS"); do one "$run"; done
