#!/usr/bin/env bash
# Finding 3: a PROMETHEUS_MAPPER_YAML of MAPPINGS (default 50,000) regex mappings (none matching, so every stat is
# tried against all) and 100 rules with hits: time and RSS of five /metrics scrapes in a row.
# usage: mapper-scrape.sh BIN [MAPPINGS]
set -u
BIN=${1:?usage: mapper-scrape.sh BIN [MAPPINGS]}
MAPPINGS=${2:-50000}
. "$(dirname "$0")/common.sh"
T=$(mktemp -d); trap 'stop; rm -rf "$T"' EXIT
mkdir -p "$T/rules"
{ printf 'domain: web\ndescriptors:\n'
  for i in $(seq 100); do printf '  - {key: k, value: v%d, rate_limit: {unit: hour, requests_per_unit: 50}}\n' "$i"; done
} >"$T/rules/web.yaml"
python3 - "$T/mapper.yaml" "$MAPPINGS" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("mappings:\n")
    for i in range(int(sys.argv[2])):
        f.write(f'  - match: "ratelimit\\\\.service\\\\.rate_limit\\\\.other{i}\\\\.(.*)\\\\.(.*)"\n'
                f'    match_type: regex\n    name: "m{i}"\n    labels: {{domain: "$1", key1: "$2"}}\n')
PY
echo "mapping file: $(wc -c <"$T/mapper.yaml") bytes"
start "$BIN" "$T/log" "$T/rules" PROMETHEUS_MAPPER_YAML="$T/mapper.yaml"
wait_healthy || { echo "not healthy:"; tail -5 "$T/log"; exit 1; }
for i in $(seq 100); do "$BIN" query --server "127.0.0.1:$GRPC" --domain web "k=v$i" >/dev/null 2>&1; done
echo "ready; RSS $(rss_mb $PID) MB; series on the page: $(curl -s "127.0.0.1:$HTTP/metrics" | grep -c '^ratelimit_service_rate_limit_web')"
for i in 1 2 3 4 5; do
  t=$(curl -s -o /dev/null -w '%{time_total}' "127.0.0.1:$HTTP/metrics")
  echo "scrape $i: ${t}s, RSS $(rss_mb $PID) MB"
done
echo "peak RSS $(hwm_mb $PID) MB"
