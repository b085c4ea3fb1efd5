#!/bin/bash
# rlqs.sh BIN PROBE {slow-readers|caps} [probe options]: issue 31's findings 5 and 7. Starts BIN
# (the server) on loopback with the rules below, runs PROBE (target/debug/examples/rlqs_probe, or
# a release build of it) against it, prints what the probe measured, stops the server.
#   slow-readers: 10 streams × 5,000 buckets reporting every 100 ms, never reading (finding 5)
#   caps: 25 streams × 10,000 buckets (200,000 held, 50,000 refused), reports in rounds (every
#         5 s or once read; --rounds N, default 3), ShouldRateLimit latency meanwhile, then the
#         server's CPU over 30 s with the streams open and silent, then closed (7)
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
"$BIN" serve --config "$D/rules" --grpc-addr 127.0.0.1:18481 --http-addr 127.0.0.1:18480 \
    > "$D/serve.log" 2>&1 & PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null' EXIT
for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:18480/healthcheck && break; sleep 0.2; done
"$PROBE" --grpc 127.0.0.1:18481 --admin 127.0.0.1:18480 --pid $PID "$MODE" "$@"
