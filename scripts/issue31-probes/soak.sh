#!/usr/bin/env bash
# Issue 31, finding 11: the server's RSS over a soak on Redis. Starts a redis-server and BIN
# (`serve`, Redis backend, default settings), drives it with examples/soak (ShouldRateLimit over
# KEYS distinct keys, RLQS streams reopened every minute), rewrites the rules every 30 s (a
# reload each time) and kills Redis (SIGKILL, started again 3 s later, empty) every 2 minutes.
# Prints one line every 10 s: seconds, VmRSS in KiB, ratelimit_store_up, reloads so far, RssAnon
# in KiB (the heap's part of RSS).
#
# usage: scripts/issue31-probes/soak.sh BIN MINUTES [examples/soak arguments…]
#   needs: cargo build --example soak (a debug build is enough for the load side); SOAK=path
#   picks another build of it.
#   SERVER_WRAP="heaptrack -o FILE": the server runs under that command (RSS is then read from
#   the server, the wrapper's child; at the end the server gets SIGTERM so the wrapper can write).
set -euo pipefail
bin=$(realpath "$1")
minutes=${2:-20}
shift 2 || true
root=$(cd "$(dirname "$0")/../.." && pwd)
soak=${SOAK:-$root/target/debug/examples/soak}
work=$(mktemp -d "${TMPDIR:-/tmp}/issue31-soak.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${wrapper:-}" ] && wait "$wrapper" 2>/dev/null || true
  [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rules() {
  cat >"$work/rules/soak.yaml.tmp" <<YAML
domain: soak
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: $1}
  - key: name
    value: per-api-key
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 600}
YAML
  mv "$work/rules/soak.yaml.tmp" "$work/rules/soak.yaml"
}
mkdir "$work/rules" "$work/redis"
rules 1000

redis_port=$(port)
start_redis() {
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work/redis" >>"$work/redis.log" 2>&1 &
  redis_pid=$!
}
start_redis
sleep 0.5

grpc=$(port)
http=$(port)
# shellcheck disable=SC2086 # SERVER_WRAP is a command line
env BACKEND_TYPE=redis REDIS_URL="127.0.0.1:$redis_port" LOG_LEVEL=warn \
  ${SERVER_WRAP:-} "$bin" serve --config "$work/rules" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
  >"$work/wrap.log" 2>"$work/server.log" &
server=$!
if [ -n "${SERVER_WRAP:-}" ]; then
  wrapper=$server
  # The server itself, however deep under the wrapper (its command line starts with the binary;
  # the wrapper's and the profiler's helpers' do not).
  for _ in $(seq 100); do server=$(pgrep -n -f "^$bin serve --config $work/rules") && break; sleep 0.1; done
  pids+=("$server")
else
  pids+=("$server")
fi
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$http/healthcheck" >/dev/null && break; sleep 0.1; done

"$soak" --addr "127.0.0.1:$grpc" --minutes "$minutes" "$@" >"$work/soak.out" 2>&1 &
pids+=($!)

metric() { curl -s "http://127.0.0.1:$http/metrics" | awk -v m="$1" '$1 == m {print $2; exit}'; }
echo "seconds rss_kib store_up reloads anon_kib"
start=$SECONDS
limit=1000
while [ $((SECONDS - start)) -lt $((minutes * 60)) ]; do
  sleep 10
  t=$((SECONDS - start))
  if [ $((t % 30)) -lt 10 ]; then
    limit=$((limit == 1000 ? 1001 : 1000))
    rules "$limit"
  fi
  if [ $((t % 120)) -lt 10 ]; then
    kill -9 "$redis_pid"
    wait "$redis_pid" 2>/dev/null || true
    sleep 3
    start_redis
  fi
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$server/status")
  anon=$(awk '/^RssAnon/ {print $2}' "/proc/$server/status")
  echo "$t $rss $(metric ratelimit_store_up) $(metric ratelimit_service_config_load_success) $anon"
done
echo "--- load (per minute):"
cat "$work/soak.out"
echo "--- server warnings: $(grep -c WARN "$work/server.log" || true), errors: $(grep -c ERROR "$work/server.log" || true)"
