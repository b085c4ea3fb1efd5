#!/usr/bin/env bash
# docs/record.md's "Before you edit a limit" example, end to end on the release binary: serve the
# shipped rules (config/) with --record, send 20 s of real traffic to POST /json (a few clients
# above their per-IP limit, API keys searching), stop, then replay the recording against a
# proposal that halves the per-IP limit, as text and as a plot.
#
# usage: scripts/record-replay-demo.sh [OUT_DIR]     (default: a temporary directory)
#   writes OUT_DIR/decisions.jsonl, OUT_DIR/proposed/edge.yaml, OUT_DIR/report.txt, OUT_DIR/replay.svg
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out/proposed"
bin=target/release/ratelimit-server
[[ -x $bin ]] || cargo build --release --bin ratelimit-server
port=$((20000 + RANDOM % 20000))
rm -f "$out/decisions.jsonl"
"$bin" serve --config config --grpc-addr "127.0.0.1:$((port + 1))" --http-addr "127.0.0.1:$port" \
  --record "$out/decisions.jsonl" >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthcheck" >/dev/null && break; sleep 0.1; done

python3 - "$port" <<'PY'
import http.client, json, sys, time
port = int(sys.argv[1])
conn = http.client.HTTPConnection("127.0.0.1", port)
def ask(descriptors):
    body = json.dumps({"domain": "edge", "descriptors": [
        {"entries": [{"key": k, "value": v} for k, v in d]} for d in descriptors]})
    conn.request("POST", "/json", body, {"content-type": "application/json"})
    conn.getresponse().read()
# Per-IP rates (requests per second): most clients well under 50/s, two around it, one scraper
# far above; API keys search at 4 to 14 per second.
ips = {"10.1.0.%d" % i: r for i, r in enumerate([5, 8, 12, 20, 30, 45, 60, 120])}
keys = {"key-%d" % i: r for i, r in enumerate([4, 9, 14])}
start = time.time()
sent = {}
while (now := time.time() - start) < 20:
    for ip, rate in ips.items():
        while sent.get(ip, 0) < rate * now:
            ask([[("remote_address", ip)]])
            sent[ip] = sent.get(ip, 0) + 1
    for key, rate in keys.items():
        while sent.get(key, 0) < rate * now:
            ask([[("api_key", key), ("path", "/v1/search")]])
            sent[key] = sent.get(key, 0) + 1
    time.sleep(0.005)
print("sent", sum(sent.values()), "requests in", round(time.time() - start, 1), "s", file=sys.stderr)
PY
kill -INT $server
wait $server || true
trap - EXIT

# The proposal: the per-IP limit halved (50 → 25 per second, burst 100 → 50).
sed -e 's/requests_per_unit: 50$/requests_per_unit: 25/' -e 's/burst: 100$/burst: 50/' \
  config/edge.yaml >"$out/proposed/edge.yaml"
diff config/edge.yaml "$out/proposed/edge.yaml" || true
"$bin" replay --config config --against "$out/proposed" --plot "$out/replay.svg" \
  "$out/decisions.jsonl" | tee "$out/report.txt"
echo "written: $out/decisions.jsonl $out/report.txt $out/replay.svg"
