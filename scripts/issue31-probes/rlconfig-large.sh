#!/usr/bin/env bash
# Finding 6: GET /rlconfig on 150,000 descriptors (four rules files) while health checks (1 s
# timeout) and decisions (`query`, 1 s timeout) run: ROUNDS (4) rounds of four concurrent GETs. Prints
# the GET times, health and decision failures, RSS before and the peak.
# usage: rlconfig-large.sh BIN [DESCRIPTORS]
set -u
BIN=${1:?usage: rlconfig-large.sh BIN [DESCRIPTORS]}
N=${2:-150000}
. "$(dirname "$0")/common.sh"
T=$(mktemp -d); trap 'stop; rm -rf "$T"' EXIT
mkdir -p "$T/rules"
python3 - "$T/rules" "$N" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
for f in range(4):
    with open(f"{d}/big{f}.yaml", "w") as out:
        out.write(f"domain: big{f}\ndescriptors:\n")
        for i in range(n // 4):
            out.write(f"  - {{key: k, value: v{i}, rate_limit: {{unit: hour, requests_per_unit: {i % 1000 + 1}}}}}\n")
PY
MEM_CAP_MB=${MEM_CAP_MB:-6000} start "$BIN" "$T/log" "$T/rules"
wait_healthy || { echo "not healthy:"; tail -5 "$T/log"; exit 1; }
echo "$N descriptors loaded; RSS $(rss_mb $PID) MB"
: >"$T/health"; : >"$T/decisions"
( while [ ! -e "$T/done" ]; do
    curl -sf -m 1 -o /dev/null "127.0.0.1:$HTTP/healthcheck" && echo ok >>"$T/health" || echo fail >>"$T/health"
    sleep 0.1
  done ) &
HP=$!
( while [ ! -e "$T/done" ]; do
    timeout 1 "$BIN" query --server "127.0.0.1:$GRPC" --domain big0 k=v1 >/dev/null 2>&1 \
      && echo ok >>"$T/decisions" || echo fail >>"$T/decisions"
    sleep 0.1
  done ) &
DP=$!
for round in $(seq "${ROUNDS:-4}"); do
  gets=()
  for g in 1 2 3 4; do
    curl -s -o "$T/body$g" -w '%{time_total}\n' "127.0.0.1:$HTTP/rlconfig" >"$T/time$g" &
    gets+=($!)
  done
  wait "${gets[@]}"
  echo "round $round: GETs $(cat "$T"/time? | sort -n | tr '\n' ' ')s; body $(wc -c <"$T/body1") bytes; RSS $(rss_mb $PID) MB"
done
touch "$T/done"; wait $HP $DP
echo "health checks failed: $(grep -c fail "$T/health") of $(wc -l <"$T/health")"
echo "decisions failed: $(grep -c fail "$T/decisions") of $(wc -l <"$T/decisions")"
echo "peak RSS $(hwm_mb $PID) MB"
