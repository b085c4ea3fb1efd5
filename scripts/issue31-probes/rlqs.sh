#!/bin/bash
# rlqs.sh BIN PROBE {slow-readers|caps} [probe options]: issue 31's findings 5 and 7. Starts BIN
# (the server) on loopback with the rules below, runs PROBE (target/debug/examples/rlqs_probe, or
# a release build of it) against it, prints what the probe measured, stops the server.
#   slow-readers: 10 streams × 5,000 buckets reporting every 100 ms, never reading (finding 5)
#   caps: 25 streams × 10,000 buckets (200,000 held, 50,000 refused), reports in rounds (every
#         5 s or once read; --rounds N, default 3), ShouldRateLimit latency meanwhile, then the
#         server's CPU over 30 s with the streams open and silent, then closed (7)
# REDIS=1: a redis-server of its own (on a free port), the server on it (BACKEND_TYPE=redis), its
# CPU beside the server's (at rest, and over the whole probe).
set -e
BIN=$1; PROBE=$2; MODE=$3; shift 3
D=${PROBE_DIR:-/tmp/issue31-rlqs}; rm -rf "$D"; mkdir -p "$D/rules"
cat > "$D/rules/rlqs.yaml" <<'RULES'
domain: rlqs-probe
descriptors:
  - key: name
    value: limited
    descriptors:
      - key: n
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: name
    value: shadow
    descriptors:
      - key: n
        rate_limit: {unit: minute, requests_per_unit: 10}
        shadow_mode: true
  - key: name
    value: decide
    rate_limit: {unit: second, requests_per_unit: 1000000}
RULES
if [ -n "${REDIS:-}" ]; then
  RPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no > "$D/redis.log" 2>&1 &
  RPID=$!
  for _ in $(seq 50); do redis-cli -p "$RPORT" ping > /dev/null 2>&1 && break; sleep 0.1; done
  export BACKEND_TYPE=redis REDIS_URL="127.0.0.1:$RPORT"
fi
"$BIN" serve --config "$D/rules" --grpc-addr 127.0.0.1:18481 --http-addr 127.0.0.1:18480 \
    > "$D/serve.log" 2>&1 & PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; [ -n "${RPID:-}" ] && kill $RPID 2>/dev/null' EXIT
# Redis's CPU seconds so far (utime + stime from /proc), printed at the end.
# (Without REDIS, nothing: an `if`, so that the function succeeds under `set -e`.)
redis_cpu() { if [ -n "${RPID:-}" ]; then awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$RPID/stat"; fi; }
for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:18480/healthcheck && break; sleep 0.2; done
R0=$(redis_cpu); T0=$(date +%s.%N)
ALSO=()
if [ -n "${RPID:-}" ] && "$PROBE" --help | grep -q -- --also-pid; then ALSO=(--also-pid "$RPID"); fi
"$PROBE" --grpc 127.0.0.1:18481 --admin 127.0.0.1:18480 --pid $PID "${ALSO[@]}" "$MODE" "$@"
if [ -n "${RPID:-}" ]; then
  echo "redis-server CPU over the whole probe: $(echo "$(redis_cpu) $R0 $(date +%s.%N) $T0" | awk '{printf "%.1f s in %.0f s (%.1f %% of a core)", $1 - $2, $3 - $4, 100 * ($1 - $2) / ($3 - $4)}')"
fi
