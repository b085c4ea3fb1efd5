#!/usr/bin/env bash
# Finding 3: a 337-byte YAML alias bomb as PROMETHEUS_MAPPER_YAML, and as a rules file, and a
# 200 MB mapping file: does the server start, refuse, or grow? Prints exit status, time and the
# highest RSS seen within 10 s. usage: yaml-bomb.sh BIN
set -u
BIN=${1:?usage: yaml-bomb.sh BIN}
. "$(dirname "$0")/common.sh"
T=$(mktemp -d); trap 'stop; rm -rf "$T"' EXIT
mkdir -p "$T/rules" "$T/bomb-rules"
printf 'domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n' >"$T/rules/web.yaml"
bomb() {
  printf 'a0: &a0 ["lol"]\n'
  for i in 1 2 3 4 5 6 7 8; do printf 'a%d: &a%d [' $i $i; for j in 1 2 3 4 5 6 7 8 9; do printf '*a%d,' $((i-1)); done; printf '*a%d]\n' $((i-1)); done
  printf '%s: *a8\n' "$1"
}
bomb mappings >"$T/bomb.yaml"
{ printf 'domain: web\n'; bomb descriptors; } >"$T/bomb-rules/web.yaml"
head -c $((200 << 20)) /dev/zero | tr '\0' '#' >"$T/huge.yaml"
run() { # name, config dir, extra env...
  local name=$1 dir=$2; shift 2
  local t0 peak=0 r; t0=$(ms)
  start "$BIN" "$T/log" "$dir" "$@"
  local status="still running after 10 s (never ready)"
  for _ in $(seq 100); do
    r=$(rss_mb $PID); [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r
    if ! kill -0 $PID 2>/dev/null; then wait $PID; status="exit $? after $(( $(ms) - t0 )) ms"; break; fi
    if curl -sf -m 1 "127.0.0.1:$HTTP/healthcheck" >/dev/null; then status="started (healthy after $(( $(ms) - t0 )) ms)"; break; fi
    sleep 0.1
  done
  stop
  echo "$name: $status; peak RSS ${peak} MB"
  grep -m1 -iE 'error' "$T/log" | cut -c1-220 | sed 's/^/    /'
}
echo "bomb: $(wc -c <"$T/bomb.yaml") bytes"
run "mapping alias bomb" "$T/rules" PROMETHEUS_MAPPER_YAML="$T/bomb.yaml"
run "rules-file alias bomb" "$T/bomb-rules"
run "200 MB mapping file" "$T/rules" PROMETHEUS_MAPPER_YAML="$T/huge.yaml"
