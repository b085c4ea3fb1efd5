#!/usr/bin/env bash
# Issue 31, finding 2: does a slow Redis, or a reply cut at start-up, make the server exit?
# Starts BIN (`serve`, Redis backend, default settings) N times per scenario behind
# faultproxy.py in front of a real redis-server, and counts the start-ups that exit within
# WAIT seconds (default 5; the exits seen were 0.3–0.5 s after start). Cut scenarios run 4×N
# start-ups (a cut is rare per start). Last: a wrong password must still exit 1, saying why.
#
# usage: scripts/issue31-probes/boot.sh BIN [N]
set -euo pipefail
bin=$(realpath "$1")
n=${2:-6}
wait_s=${WAIT:-5}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/issue31-boot.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
port() {
  local p=""
  while [ -z "$p" ]; do
    p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || true)
  done
  echo "$p"
}

mkdir "$work/rules"
printf 'domain: boot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n' >"$work/rules/boot.yaml"

redis_port=$(port)
redis-server --port "$redis_port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
redis_pid=$!
sleep 0.3

# start_once PROXY_PORT [ENV…]: prints "exit CODE: MESSAGE" or "up"
start_once() {
  local proxy=$1
  shift
  local log=$work/server.log
  env BACKEND_TYPE=redis REDIS_URL="127.0.0.1:$proxy" CACHE_KEY_PREFIX=boot: SHUTDOWN_DELAY=0s "$@" \
    "$bin" serve --config "$work/rules" --grpc-addr "127.0.0.1:$(port)" --http-addr "127.0.0.1:$(port)" \
    >/dev/null 2>"$log" &
  local pid=$!
  local deadline=$((SECONDS + wait_s))
  while [ $SECONDS -lt $deadline ] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    if grep -q "UNREACHABLE AT START-UP" "$log"; then
      echo "up (failure mode)"
    elif grep -q "counters in Redis" "$log"; then
      echo "up (on Redis)"
    else
      echo "up (still connecting)"
    fi
  else
    local code=0
    wait "$pid" || code=$?
    echo "exit $code: $(grep -iE 'error|unavailable|refuses' "$log" | tail -1 | cut -c1-160)"
  fi
}

# scenario NAME STARTS PROXY_ARGS…
scenario() {
  local name=$1 starts=$2
  shift 2
  local proxy_port
  proxy_port=$(port)
  python3 "$here/faultproxy.py" "$proxy_port" "$redis_port" "$@" &
  local proxy_pid=$!
  sleep 0.3
  local exits=0 results=$work/results
  : >"$results"
  for _ in $(seq "$starts"); do
    start_once "$proxy_port" | tee -a "$results" >/dev/null
  done
  kill "$proxy_pid"
  wait "$proxy_pid" 2>/dev/null || true
  exits=$(grep -c '^exit' "$results" || true)
  printf '%-28s exit %2d/%-2d  %s\n' "$name" "$exits" "$starts" \
    "$(sort "$results" | uniq -c | sort -rn | head -3 | sed 's/^ *//' | tr '\n' ';')"
}

scenario "redis 60 ms away each way" "$n" --delay-ms 60
scenario "redis 80 ms away each way" "$n" --delay-ms 80
scenario "redis 100 ms away each way" "$n" --delay-ms 100
scenario "redis 200 ms away each way" "$n" --delay-ms 200
scenario "2% of replies cut" $((4 * n)) --cut-percent 2 --seed 2
scenario "20% of replies cut" $((4 * n)) --cut-percent 20 --seed 20
scenario "no fault" 2

# A wrong password: a refusal, which must still stop the start (straight to Redis: behind a link
# slower than REDIS_TIMEOUT a refusal cannot be told from a timeout).
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
redis-server --port "$redis_port" --save '' --appendonly no --requirepass right-pass >"$work/redis.log" 2>&1 &
pids+=($!)
sleep 0.3
printf '%-28s %s\n' "wrong password" "$(start_once "$redis_port" REDIS_AUTH=wrong-pass)"
