#!/usr/bin/env bash
# Issue 34's benchmark: CPU per decision of the server (memory and Redis stores) against an
# independent no-op tonic server, and redis-server's CPU per decision; then the same server's
# instructions per call under callgrind (exact; the number for before/after on a shared machine).
#
# usage: scripts/cost-per-decision.sh [load|callgrind|redis|redis-ab|perf|syscalls|wakeups|commandstats|capacity|all] (default: all)
#   BIN=target/release/ratelimit-server  the server binary to measure (e.g. an older build)
#   LOAD=target/release/examples/load    the load generator (also serves the no-op server)
#   ROUNDS=5 DURATION=3                  alternating rounds, seconds measured per run
#   SHAPES=1x16,4x64,8x64 KEYS=100k-zipf,1 BACKENDS=memory,redis (for `load`: memory,redis,noop-redis,
#                                        noop-redis being the Redis baseline, examples/load/noop_redis.rs,
#                                        ping-redis its floor, one PING per call, and
#                                        ping-redis-thread that floor driven on a thread of its own,
#                                        ping-redis-percore that floor thread per core (a connection
#                                        per thread), ping-redis-percore-thread the same with one
#                                        connection on a thread of its own;
#                                        `syscalls` and `wakeups` take it too, in place of BIN)
#   CALLS=20000                          calls under callgrind / perf (×10), syscalls and wakeups (×2),
#                                        commandstats (×5)
#   REDIS_KEYS=100k-zipf,1 REDIS_SHAPE=4x64  the key mixes and shape of `redis`
#   REDIS_UNDER=redis,server             which process `redis` runs under callgrind
#   REDIS_BASELINE=1                     `redis` measures the Redis baseline (examples/load/noop_redis.rs:
#                                        the reference's INCRBY + EXPIRE through redis-rs) instead of BIN
#   PERF_BACKEND=memory PERF_SHAPE=4x64  the store `perf` profiles (memory, redis, or a Redis baseline in
#                                        place of BIN: noop-redis, ping-redis, ping-redis-thread) and its shape,
#   PERF_TOP=40                          over the first of KEYS; how many symbols it lists
#   WORKERS=N                            the server's request workers (TOKIO_WORKER_THREADS); unset: its default
#   NOOP_TRANSPORT_AS_OURS=1             the no-op server with the server's default HTTP/2 settings
#                                        (keepalive every 30 s, 10 s to answer, 1,024 streams) instead of tonic's
#   REDIS_SERVER=redis-server            the Redis server to start (e.g. valkey-server: scripts/install-valkey.sh)
#   RULE_RPU=1000000000                  the rule's requests per RULE_UNIT per key (1: mostly denials)
#   RULE_UNIT=second                     the rule's unit (minute: a window's key is held across decisions,
#                                        for builds run with DEFAULT_ALGORITHM=fixed_window)
#   CALLGRIND_KEYS=100k-zipf CALLGRIND_SHAPE=4x64  the key mix and shape `callgrind` drives
#   CACHE_SIM=1                          `callgrind` and `redis` simulate the caches too and print
#                                        first-level and last-level misses per call beside instructions
#   capacity                             redis-server's CPU per decision when it is busy: the commands of
#                                        CALLS×5 decisions (ours, then the Redis baseline's) recorded through a
#                                        proxy and sent again back to back (redis-cli --pipe), Redis on a CPU
#                                        of its own; REDIS_KEYS, REDIS_SHAPE and REDIS_SERVER apply
#   A=… (B=$BIN) (C=…)                   `redis-ab`: two builds, or three (any may be a Redis baseline:
#                                        noop-redis, ping-redis, ping-redis-thread), in alternating ROUNDS, natively: per
#                                        build a fresh redis-server and server, 20,000 warm-up calls,
#                                        then CALLS×5 at REDIS_SHAPE over the first of REDIS_KEYS; the
#                                        CPU (user + system, /proc) of each process per decision, and
#                                        the measured calls a second (wall clock; the load shares the CPUs)
# Build first: cargo build --release --bin ratelimit-server --example load
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
BIN=${BIN:-target/release/ratelimit-server}
LOAD=${LOAD:-target/release/examples/load}
CALLGRIND=(valgrind --tool=callgrind ${CACHE_SIM:+--cache-sim=yes})
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-3}
SHAPES=${SHAPES:-1x16,4x64,8x64}
KEYS=${KEYS:-100k-zipf,1}
LOAD_BACKENDS=${BACKENDS:-memory,redis,noop-redis}
BACKENDS=${BACKENDS:-memory,redis}
CALLS=${CALLS:-20000}
CALLGRIND_KEYS=${CALLGRIND_KEYS:-100k-zipf}
CALLGRIND_SHAPE=${CALLGRIND_SHAPE:-4x64}
REDIS_KEYS=${REDIS_KEYS:-100k-zipf,1}
REDIS_SHAPE=${REDIS_SHAPE:-4x64}
REDIS_UNDER=${REDIS_UNDER:-redis,server}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
export REDIS_SERVER  # examples/load starts it too
for f in "$BIN" "$LOAD"; do
  [ -x "$f" ] || { echo "missing $f: cargo build --release --bin ratelimit-server --example load" >&2; exit 2; }
done
# WORKERS=N: the measured server (BIN, and B of redis-ab; not the no-op server nor the load
# generator) runs with TOKIO_WORKER_THREADS=N, through a wrapper that keeps its process id.
if [ -n "${WORKERS:-}" ]; then
  wrapper=$(mktemp)
  printf '#!/bin/sh\nTOKIO_WORKER_THREADS=%s exec %s "$@"\n' "$WORKERS" "$(realpath "$BIN")" > "$wrapper"
  chmod +x "$wrapper"; BIN=$wrapper
fi

# The load's rules (examples/load: a token bucket nobody reaches, so every decision writes;
# RULE_RPU=1 for one a key reaches, so most decisions are denials that write nothing; RULE_UNIT
# its unit, a second unless set).
rules() {
  mkdir -p "$1"
  cat > "$1/load.yaml" <<RULES
domain: load
descriptors:
  - key: user
    rate_limit: {unit: ${RULE_UNIT:-second}, requests_per_unit: ${RULE_RPU:-1000000000}}
RULES
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_healthy() {
  for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$1/healthcheck" && return 0; sleep 0.1; done
  echo "the server never became healthy" >&2; return 1
}

load() {
  echo "== CPU per call: no-op tonic server vs $BIN ($LOAD_BACKENDS), $ROUNDS alternating rounds of ${DURATION}s"
  "$LOAD" --client h2 --duration "$DURATION" --rounds "$ROUNDS" --keys "$KEYS" --shapes "$SHAPES" \
    --backend "$LOAD_BACKENDS" --server-bin "$BIN"
}

# The Redis baseline's command (examples/load/noop_redis.rs, on the Redis in REDIS_URL) serving
# gRPC on $1 with the rules in $3/rules, in the array BASELINE ($2: the admin port it is given;
# $4: noop-redis, the default, ping-redis or ping-redis-thread).
baseline_cmd() {
  BASELINE=("$LOAD" --serve "${4:-noop-redis}" --addr 127.0.0.1:$1 --admin-addr 127.0.0.1:$2 --config "$3/rules")
}

# Whether $1 names one of the Redis baselines rather than a server binary.
is_baseline() { case "$1" in noop-redis|ping-redis|ping-redis-thread|ping-redis-percore|ping-redis-percore-thread) true ;; *) false ;; esac; }

# Starts build $1 (a server binary, or a Redis baseline: noop-redis, ping-redis, ping-redis-thread) on
# the Redis at 127.0.0.1:$2, serving gRPC on $3 (admin on $4) with the rules in $dir/rules, its
# output in $5; waits until it serves and sets SERVED_PID.
serve_on_redis() {
  if is_baseline "$1"; then
    baseline_cmd "$3" "$4" "$dir" "$1"
    REDIS_URL=127.0.0.1:$2 "${BASELINE[@]}" > "$5" 2>&1 & SERVED_PID=$!
    wait_port "$3"
  else
    SHUTDOWN_DELAY=0s LOG_LEVEL=warn BACKEND_TYPE=redis REDIS_URL=127.0.0.1:$2 CACHE_KEY_PREFIX=load: \
      "$1" serve --config "$dir/rules" --grpc-addr 127.0.0.1:$3 --http-addr 127.0.0.1:$4 > "$5" 2>&1 & SERVED_PID=$!
    wait_healthy "$4"
  fi
}

wait_port() {
  for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on $1" >&2; return 1
}

# One server under callgrind: $1 = label (noop or server), $2 = calls; its counts in $dir/cg.$1.$2.
callgrind_one() {
  local label=$1 calls=$2 grpc http pid
  grpc=$(free_port); http=$(free_port)
  if [ "$label" = noop ]; then
    "${CALLGRIND[@]}" --callgrind-out-file="$dir/cg.$label.$calls" \
      "$LOAD" --serve noop --addr 127.0.0.1:$grpc --admin-addr 127.0.0.1:$http --config "$dir/rules" \
      > "$dir/$label.$calls.log" 2>&1 & pid=$!
    wait_port $grpc
  else
    SHUTDOWN_DELAY=0s LOG_LEVEL=warn "${CALLGRIND[@]}" --callgrind-out-file="$dir/cg.$label.$calls" \
      "$BIN" serve --config "$dir/rules" --grpc-addr 127.0.0.1:$grpc --http-addr 127.0.0.1:$http \
      > "$dir/$label.$calls.log" 2>&1 & pid=$!
    wait_healthy $http
  fi
  if [ "$calls" -gt 0 ]; then
    "$LOAD" --drive 127.0.0.1:$grpc --calls "$calls" --keys "$CALLGRIND_KEYS" --shapes "$CALLGRIND_SHAPE" > /dev/null
  fi
  kill -TERM $pid; wait $pid || true
}

total() { callgrind_annotate "$1" | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'; }

# Under CACHE_SIM=1, each event callgrind counted, per call: ($1 - $2) / $3 for the runs with and
# without calls ($1 and $2 their output files). Ir instructions; D1mr / D1mw first-level data
# read / write misses, I1mr instruction misses; DLmr / DLmw / ILmr the same at the last level.
misses() {
  [ -n "${CACHE_SIM:-}" ] || return 0
  python3 - "$1" "$2" "$3" <<'PY'
import subprocess, sys
def events(path):
    out = subprocess.run(["callgrind_annotate", path], capture_output=True, text=True).stdout
    names = next(l.split(":", 1)[1].split() for l in out.splitlines() if l.startswith("Events shown:"))
    totals = next(l for l in out.splitlines() if "PROGRAM TOTALS" in l)
    values = [int(t.replace(",", "")) for t in totals.split() if t.replace(",", "").isdigit()]
    return dict(zip(names, values))
full, base, calls = events(sys.argv[1]), events(sys.argv[2]), int(sys.argv[3])
print("   per call: " + "  ".join(f"{k} {(full[k] - base.get(k, 0)) / calls:,.1f}" for k in full))
PY
}

# Instructions per call of the whole request path (listener, HTTP/2, decode, engine, metrics,
# encode, allocation): each server under callgrind, CALLS calls at 4x64 over 100k zipf keys, then
# SIGTERM (callgrind writes its counts at exit); the same with no call subtracted (start-up and
# shutdown). Then the functions whose own instructions per call differ most between the two.
callgrind() {
  dir=$(mktemp -d); rules "$dir/rules"
  for label in noop server; do
    callgrind_one $label 0
    callgrind_one $label "$CALLS"
    local base full
    base=$(total "$dir/cg.$label.0"); full=$(total "$dir/cg.$label.$CALLS")
    echo "== callgrind, $label: $(( (full - base) / CALLS )) instructions per call"
    misses "$dir/cg.$label.$CALLS" "$dir/cg.$label.0" "$CALLS"
    callgrind_annotate --show=Ir "$dir/cg.$label.$CALLS" > "$dir/self.$label.txt"
  done
  python3 - "$dir" "$CALLS" <<'PY'
import re, sys
d, calls = sys.argv[1], int(sys.argv[2])
def self_costs(label):
    costs = {}
    for line in open(f"{d}/self.{label}.txt"):
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S.*?)(?: \[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r"^\S*?:", "", m.group(2), count=1)
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", "")) / calls
    return costs
noop, ours = self_costs("noop"), self_costs("server")
print(f"-- top functions of the server, own instructions per call (the no-op's beside):")
for name, c in sorted(ours.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{c:9.0f} {noop.get(name, 0):9.0f}  {name[:110]}")
print(f"-- largest differences, server minus no-op, instructions per call:")
names = set(noop) | set(ours)
for name in sorted(names, key=lambda n: -(ours.get(n, 0) - noop.get(n, 0)))[:30]:
    print(f"{ours.get(name, 0) - noop.get(name, 0):+9.0f}  {name[:110]}")
PY
  echo "(callgrind output kept in $dir)"
}

# One Redis-store run for `redis`: $1 = what runs under callgrind (redis, server or none), $2 =
# key mix, $3 = calls. A redis-server and the server (BACKEND_TYPE=redis) on free ports, CALLS
# calls through the server, then both stopped (callgrind writes its counts at exit). Prints
# redis-server's script calls, in-script commands and CPU seconds (INFO commandstats / cpu).
redis_one() {
  local under=$1 keys=$2 calls=$3 rport grpc http rpid spid tag=$1.$2.$3
  rport=$(free_port); grpc=$(free_port); http=$(free_port)
  local rcmd=("$REDIS_SERVER" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no)
  local scmd=("$BIN" serve --config "$dir/rules" --grpc-addr 127.0.0.1:$grpc --http-addr 127.0.0.1:$http)
  if [ -n "${REDIS_BASELINE:-}" ]; then
    baseline_cmd $grpc $http "$dir"; scmd=("${BASELINE[@]}")
  fi
  if [ "$under" = redis ]; then rcmd=("${CALLGRIND[@]}" --callgrind-out-file="$dir/cg.$tag" "${rcmd[@]}"); fi
  if [ "$under" = server ]; then scmd=("${CALLGRIND[@]}" --callgrind-out-file="$dir/cg.$tag" "${scmd[@]}"); fi
  "${rcmd[@]}" > "$dir/redis.$tag.log" 2>&1 & rpid=$!
  for _ in $(seq 600); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
  SHUTDOWN_DELAY=0s LOG_LEVEL=warn BACKEND_TYPE=redis REDIS_URL=127.0.0.1:$rport CACHE_KEY_PREFIX=load: \
    "${scmd[@]}" > "$dir/server.$tag.log" 2>&1 & spid=$!
  if [ -n "${REDIS_BASELINE:-}" ]; then wait_port $grpc; else wait_healthy $http; fi
  redis-cli -p "$rport" config resetstat > /dev/null
  if [ "$calls" -gt 0 ]; then
    "$LOAD" --drive 127.0.0.1:$grpc --calls "$calls" --keys "$keys" --shapes "$REDIS_SHAPE" > /dev/null
  fi
  redis-cli -p "$rport" info commandstats > "$dir/stats.$tag"
  redis-cli -p "$rport" info cpu >> "$dir/stats.$tag"
  kill -TERM $spid; wait $spid || true
  redis-cli -p "$rport" shutdown nosave > /dev/null 2>&1 || true; wait $rpid || true
}

# The Redis store's cost per decision, in instructions (callgrind: deterministic, whatever the
# machine's load): redis-server's, then the server's, per call at REDIS_SHAPE over each of
# REDIS_KEYS (a run with no call subtracted); and redis-server's script calls per decision.
redis_cost() {
  dir=$(mktemp -d); rules "$dir/rules"
  local keys under base full
  for keys in ${REDIS_KEYS//,/ }; do
    for under in ${REDIS_UNDER//,/ }; do
      redis_one $under "$keys" 0
      redis_one $under "$keys" "$CALLS"
      base=$(total "$dir/cg.$under.$keys.0"); full=$(total "$dir/cg.$under.$keys.$CALLS")
      echo "== $keys, $REDIS_SHAPE: $under${REDIS_BASELINE:+ (the Redis baseline)} $(( (full - base) / CALLS )) instructions per decision"
      misses "$dir/cg.$under.$keys.$CALLS" "$dir/cg.$under.$keys.0" "$CALLS"
    done
    python3 - "$dir/stats.$under.$keys.$CALLS" "$CALLS" <<'PY'
import re, sys
text, calls = open(sys.argv[1]).read(), int(sys.argv[2])
stat = {m[0]: (int(m[1]), float(m[2])) for m in re.findall(r"cmdstat_(\w+):calls=(\d+),usec=(\d+)", text)}
scripts = sum(stat.get(c, (0, 0))[0] for c in ("evalsha", "eval", "fcall"))
inner = ", ".join(f"{c} {n / calls:.2f}" for c, (n, _) in sorted(stat.items()) if c not in ("evalsha", "eval", "fcall", "ping", "info", "config"))
print(f"   script calls per decision {scripts / calls:.3f}; other commands per decision (those scripts run, and plain compare-and-sets: set): {inner}")
PY
  done
  echo "(callgrind output kept in $dir)"
}

# Where the server's CPU goes under load (sampling, all threads): perf over a run of CALLS x 10
# calls at PERF_SHAPE (4x64) over the first of KEYS (100k zipf keys by default), on PERF_BACKEND
# (memory, redis: a redis-server of its own, or a Redis baseline in place of BIN: noop-redis,
# ping-redis, ping-redis-thread).
# Prints the samples by thread and by user/kernel (at 2999 Hz: µs per call = samples / 2999 /
# calls x 1e6), the top PERF_TOP (40) symbols, and µs per call by part (kernel, allocator, ...).
# Starts $BIN on the store $1 (memory, or redis on a redis-server of its own; a Redis baseline,
# examples/load/noop_redis.rs, in its place) with the rules in $2/rules; sets SERVER_PID,
# SERVER_GRPC and, for Redis, REDIS_PID and REDIS_PORT. `stop_server` stops both.
start_server() {
  local http env=(); SERVER_GRPC=$(free_port); http=$(free_port); REDIS_PID=""
  if [ "$1" = redis ] || is_baseline "$1"; then
    REDIS_PORT=$(free_port)
    "$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no > "$2/redis.log" 2>&1 & REDIS_PID=$!
    for _ in $(seq 300); do redis-cli -p "$REDIS_PORT" ping > /dev/null 2>&1 && break; sleep 0.1; done
    env=(BACKEND_TYPE=redis REDIS_URL=127.0.0.1:$REDIS_PORT CACHE_KEY_PREFIX=load:)
  fi
  if is_baseline "$1"; then
    baseline_cmd $SERVER_GRPC $http "$2" "$1"
    env "${env[@]}" "${BASELINE[@]}" > "$2/serve.log" 2>&1 & SERVER_PID=$!
    wait_port $SERVER_GRPC; return
  fi
  env SHUTDOWN_DELAY=0s LOG_LEVEL=warn "${env[@]}" "$BIN" serve --config "$2/rules" \
    --grpc-addr 127.0.0.1:$SERVER_GRPC --http-addr 127.0.0.1:$http > "$2/serve.log" 2>&1 & SERVER_PID=$!
  wait_healthy $http
}

stop_server() {
  kill -TERM $SERVER_PID; wait $SERVER_PID || true
  if [ -n "$REDIS_PID" ]; then
    redis-cli -p "$REDIS_PORT" shutdown nosave > /dev/null 2>&1 || true; wait $REDIS_PID || true
  fi
}

perf_profile() {
  local dir keys=${KEYS%%,*}; dir=$(mktemp -d); rules "$dir/rules"
  start_server "${PERF_BACKEND:-memory}" "$dir"
  "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls 20000 --keys "$keys" --shapes "${PERF_SHAPE:-4x64}" > /dev/null
  perf record -q -e cpu-clock -F 2999 -g -p $SERVER_PID -o "$dir/perf.data" -- sleep 60 &
  local perf=$!
  sleep 0.5
  "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls $((CALLS * 10)) --keys "$keys" --shapes "${PERF_SHAPE:-4x64}"
  kill -INT $perf; wait $perf || true
  stop_server
  echo "-- samples by thread and where ($((CALLS * 10)) calls, 2999 Hz):"
  # (`|| true`: `head` closing the pipe early is not a failure)
  perf report -i "$dir/perf.data" --no-children --sort comm,dso --stdio -g none -n 2>/dev/null | grep '%' | head -12 || true
  perf report -i "$dir/perf.data" --no-children --sort symbol --stdio -g none -n 2>/dev/null | grep '%' | head -${PERF_TOP:-40} |
    sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//' || true
  echo "-- µs of samples per call by part (symbols grouped by name: the kernel, the allocator, mem*, the"
  echo "   server's own crates or the baseline's service, redis-rs, h2/hyper/tonic/prost, tokio, the rest):"
  perf report -i "$dir/perf.data" --no-children --sort symbol --stdio -g none -n 2>/dev/null |
    python3 -c '
import collections, re, sys
calls, parts = int(sys.argv[1]), collections.Counter()
rules = [("allocator", r"mi_|malloc|free|_int_|unlink_chunk|realloc"), ("mem*", r"mem(move|cpy|set|cmp)"),
         ("ours / the baseline service", r"ratelimit_|noop_redis"), ("redis-rs", r"redis::|combine::"),
         ("h2/hyper/tonic/prost", r"h2::|hyper|tonic|tower|http::|prost|bytes::"), ("tokio", r"tokio")]
for line in sys.stdin:
    m = re.match(r"\s*[\d.]+%\s+(\d+)\s+\[(.)\]\s+(.*)", line)
    if m:
        part = "kernel" if m[2] == "k" else next((p for p, r in rules if re.search(r, m[3])), "the rest")
        parts[part] += int(m[1])
for part, samples in parts.most_common() + [("all", sum(parts.values()))]:
    print("%-30s %6.2f" % (part, samples * 1e6 / 2999 / calls))
' $((CALLS * 10))
  echo "(perf data kept in $dir)"
}

# redis-server's and the server's CPU per decision on the Redis store, natively, for builds A and
# B in alternating rounds (CPU time of each process from /proc over the measured calls only).
redis_ab() {
  local a=${A:?redis-ab: A=<the other build>} b=${B:-$BIN} calls=$((CALLS * 5)) keys=${REDIS_KEYS%%,*}
  local dir hz r name bin; dir=$(mktemp -d); rules "$dir/rules"; hz=$(getconf CLK_TCK)
  ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
  one() { # BIN -> "redis-server µs, server µs" per decision, decisions a second
    local rport grpc http rpid spid r0 s0 r1 s1 t0 t1
    rport=$(free_port); grpc=$(free_port); http=$(free_port)
    "$REDIS_SERVER" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no > "$dir/redis.log" 2>&1 & rpid=$!
    for _ in $(seq 300); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
    serve_on_redis "$1" "$rport" "$grpc" "$http" "$dir/server.log"; spid=$SERVED_PID
    "$LOAD" --drive 127.0.0.1:$grpc --calls 20000 --keys "$keys" --shapes "$REDIS_SHAPE" > /dev/null
    r0=$(ticks $rpid); s0=$(ticks $spid); t0=$(date +%s.%N)
    "$LOAD" --drive 127.0.0.1:$grpc --calls "$calls" --keys "$keys" --shapes "$REDIS_SHAPE" > /dev/null
    r1=$(ticks $rpid); s1=$(ticks $spid); t1=$(date +%s.%N)
    kill -TERM $spid; wait $spid || true
    redis-cli -p "$rport" shutdown nosave > /dev/null 2>&1 || true; wait $rpid || true
    python3 -c "print(f'{($r1-$r0)*1e6/$hz/$calls:.1f} {($s1-$s0)*1e6/$hz/$calls:.1f} {$calls/($t1-$t0):.0f}')"
  }
  echo "== Redis store, $calls calls at $REDIS_SHAPE over $keys: A=$a B=$b${C:+ C=$C}"
  echo "| round | build | redis-server CPU µs per decision | server CPU µs per decision | decisions a second | load average |"
  echo "|---|---|---|---|---|---|"
  for r in $(seq "$ROUNDS"); do
    for name in A B ${C:+C}; do
      case $name in A) bin=$a ;; B) bin=$b ;; C) bin=$C ;; esac
      read -r redis server rate < <(one "$bin")
      echo "| $r | $name | $redis | $server | $rate | $(cut -d' ' -f1 /proc/loadavg) |"
    done
  done
}

# Who wakes whom, and who is switched out sleeping (S) or preempted (R), per decision: the whole
# machine's sched_wakeup and sched_switch events (perf record -a) while the load runs, the
# server's threads told apart from the load generator's by thread id; and the wakes into the
# server's threads and elsewhere, by whether the wakee runs on the waker's CPU (a wake across CPUs
# costs this VM about 14 µs of CPU, one on the same CPU 2.6: `perf bench sched pipe`, with and
# without `taskset -c 0`). Counts, like `syscalls`.
wakeups() {
  local dir keys=${KEYS%%,*} calls=$((CALLS * 2)); dir=$(mktemp -d); rules "$dir/rules"
  echo "== wake-ups and switches per call, $calls calls over $keys ($BIN); srv: the server's threads"
  for backend in ${BACKENDS//,/ }; do
    for shape in ${SHAPES//,/ }; do
      start_server "$backend" "$dir"
      "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls 20000 --keys "$keys" --shapes "$shape" > /dev/null
      perf record -q -a -e sched:sched_wakeup,sched:sched_switch -o "$dir/sched.data" -- sleep 600 &
      local rec=$!
      sleep 0.5
      "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls $calls --keys "$keys" --shapes "$shape" > /dev/null
      kill -INT $rec; wait $rec || true
      ls "/proc/$SERVER_PID/task" > "$dir/server.tids"
      stop_server
      perf script -i "$dir/sched.data" -F comm,tid,cpu,event,trace 2> /dev/null |
        python3 -c '
import collections, re, sys
n, label, server = int(sys.argv[1]), sys.argv[2], set(open(sys.argv[3]).read().split())
who = lambda comm, tid: ("srv:" if tid in server else "") + comm
counts = collections.Counter()
for line in sys.stdin:
    m = re.match(r"\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+(\S+):\s+(.*)", line)
    if not m:
        continue
    comm, tid, cpu, event, trace = m.groups()
    if event.endswith("sched_wakeup"):
        wakee = re.search(r"comm=(.+?) pid=(\d+).*target_cpu=(\d+)", trace)
        across = "across CPUs" if int(wakee.group(3)) != int(cpu) else "same CPU"
        counts["wakes | " + who(comm, tid) + " -> " + who(*wakee.groups()[:2])] += 1
        counts["wakes %s | into the server" % across if wakee.group(2) in server else "wakes %s | elsewhere" % across] += 1
    elif event.endswith("sched_switch"):
        state = re.search(r"prev_state=(\S+)", trace).group(1)
        counts["switched out | " + who(comm, tid) + " " + state] += 1
for k, v in sorted(counts.items()):
    if v > n / 200:
        print("| %s | %s | %.3f |" % (label, k, v / n))
' "$calls" "$backend $shape" "$dir/server.tids"
    done
  done
}

# System calls and context switches per decision of each of the server's threads (perf stat on
# the raw_syscalls tracepoint: counts, not durations, so steady on a busy machine), for the memory
# and Redis stores at each of SHAPES over the first of KEYS.
syscalls() {
  local dir keys=${KEYS%%,*} calls=$((CALLS * 2)); dir=$(mktemp -d); rules "$dir/rules"
  echo "== system calls and context switches per call, $calls calls over $keys ($BIN)"
  echo "| store | shape | thread | syscalls per call | context switches per call |"
  echo "|---|---|---|---|---|"
  for backend in ${BACKENDS//,/ }; do
    for shape in ${SHAPES//,/ }; do
      start_server "$backend" "$dir"
      "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls 20000 --keys "$keys" --shapes "$shape" > /dev/null
      perf stat --per-thread -e raw_syscalls:sys_enter,context-switches -p $SERVER_PID -o "$dir/stat" &
      local stat=$!
      sleep 0.5
      "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls $calls --keys "$keys" --shapes "$shape" > /dev/null
      kill -INT $stat; wait $stat || true
      stop_server
      # Lines "<thread name>-<tid> <count> <event>"; threads folded by name (tokio-rt-worker…).
      awk -v n=$calls -v b=$backend -v s=$shape '$2 ~ /^[0-9,]+$/ {
          name = $1; sub(/-[0-9]+$/, "", name); gsub(",", "", $2)
          if ($3 ~ /sys_enter/) sc[name] += $2; else cs[name] += $2 }
        END { for (t in sc) { all_sc += sc[t]; all_cs += cs[t]
                if (sc[t] > n / 100) printf "| %s | %s | %s | %.2f | %.2f |\n", b, s, t, sc[t] / n, cs[t] / n }
              printf "| %s | %s | **all** | %.2f | %.2f |\n", b, s, all_sc / n, all_cs / n }' "$dir/stat" | sort
    done
  done
}

# What redis-server does per decision, by command (its INFO commandstats, reset after the warm-up:
# commands run inside a script are counted under their own names too, and their time is also in
# the script's) and its reads, writes and bytes (INFO stats), at each of SHAPES over the first of
# KEYS on the Redis store, with redis-server's CPU per decision from /proc.
commandstats() {
  local dir keys=${KEYS%%,*} calls=$((CALLS * 5)) hz; dir=$(mktemp -d); rules "$dir/rules"; hz=$(getconf CLK_TCK)
  echo "== redis-server per decision, $calls calls over $keys ($BIN)"
  echo "| shape | what | per decision | µs per decision | µs per call |"
  echo "|---|---|---|---|---|"
  for shape in ${SHAPES//,/ }; do
    start_server redis "$dir"
    "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls 20000 --keys "$keys" --shapes "$shape" > /dev/null
    redis-cli -p "$REDIS_PORT" config resetstat > /dev/null
    local r0 r1; r0=$(awk '{print $14 + $15}' "/proc/$REDIS_PID/stat")
    "$LOAD" --drive 127.0.0.1:$SERVER_GRPC --calls $calls --keys "$keys" --shapes "$shape" > /dev/null
    r1=$(awk '{print $14 + $15}' "/proc/$REDIS_PID/stat")
    { redis-cli -p "$REDIS_PORT" info commandstats; redis-cli -p "$REDIS_PORT" info stats; } > "$dir/info"
    stop_server
    python3 -c '
import re, sys
n, shape, cpu = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
print("| %s | redis-server CPU | | %.2f | |" % (shape, cpu))
for line in open(sys.argv[4]):
    m = re.match(r"cmdstat_(\w+):calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)", line)
    if m and int(m[2]) > n / 1000:
        print("| %s | %s | %.3f | %.2f | %s |" % (shape, m[1], int(m[2]) / n, int(m[3]) / n, m[4]))
    m = re.match(r"(total_net_input_bytes|total_reads_processed|total_writes_processed):(\d+)", line)
    if m:
        print("| %s | %s | %.2f | | |" % (shape, m[1], int(m[2]) / n))
' "$calls" "$shape" "$(python3 -c "print(($r1 - $r0) * 1e6 / $hz / $calls)")" "$dir/info"
  done
  # The same kinds of command back to back on an otherwise idle redis-server (redis-benchmark, 16
  # pipelined): what each costs when Redis has a core and warm caches to itself. The script is a
  # one-key compare-and-set of the shape of ours (`SET … PXAT … GET`, then a compare); ours takes
  # its group sizes as binary, which redis-benchmark cannot pass.
  local port sha value="5000000000;d.1234;99999999999999"; port=$(free_port)
  "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no > "$dir/bench.log" 2>&1 & local bpid=$!
  for _ in $(seq 300); do redis-cli -p "$port" ping > /dev/null 2>&1 && break; sleep 0.1; done
  sha=$(redis-cli -p "$port" script load "local v = redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3], 'GET') if v == ARGV[1] then return 1 end return {v}")
  redis-benchmark -p "$port" -n 200000 -P 16 -q evalsha "$sha" 1 k "$value" "$value" 99999999999999 > /dev/null
  redis-benchmark -p "$port" -n 200000 -P 16 -q set k2 "$value" NX PXAT 99999999999999 GET > /dev/null
  redis-cli -p "$port" info commandstats | grep -E '^cmdstat_(evalsha|set):' |
    sed -E 's/^cmdstat_([a-z]+):.*usec_per_call=([0-9.]+).*/| back to back, idle redis-server | \1 | | | \2 |/'
  redis-cli -p "$port" shutdown nosave > /dev/null 2>&1 || true; wait $bpid || true
}

# redis-server's CPU per decision when it is busy (the case of many instances on one shard): the
# commands the server (or, with the baseline, examples/load/noop_redis.rs) sent for CALLS x 5
# decisions at REDIS_SHAPE over each of REDIS_KEYS, recorded through a proxy
# (scripts/redis-capture.py), their expiries moved ahead, then sent again back to back by
# `redis-cli --pipe` to a fresh redis-server with a CPU of its own (taskset -c 1; the sender on
# CPU 0), ROUNDS times: its CPU (INFO cpu, µs) per decision, and its commands per decision, as
# recorded and as replayed (a replay whose command mix differs from the recording's has not
# measured the same work).
capacity() {
  local dir keys side calls=$((CALLS * 5)); dir=$(mktemp -d); rules "$dir/rules"
  cpu() { redis-cli -p "$1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {t += $2} END {printf "%.6f", t}'; }
  per_decision() { # INFO commandstats in $1 -> "script calls, commands (those in scripts too)" per decision
    python3 - "$1" "$calls" <<'PY'
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
stat = {m[0]: int(m[1]) for m in re.findall(r"cmdstat_(\w+):calls=(\d+)", text)}
scripts = sum(stat.get(c, 0) for c in ("evalsha", "eval", "fcall"))
other = {c: k for c, k in stat.items() if c not in ("evalsha", "eval", "fcall")}
print("%.3f %s" % (scripts / n, ", ".join("%s %.2f" % (c, k / n) for c, k in sorted(other.items()) if k / n >= 0.01)))
PY
  }
  echo "== redis-server busy: $calls decisions at $REDIS_SHAPE recorded, then sent back to back ($REDIS_SERVER)"
  echo "| keys | server | recorded: script calls / commands per decision | replayed: the same | redis-server CPU µs per decision, replayed (median [range] of $ROUNDS) |"
  echo "|---|---|---|---|---|"
  for keys in ${REDIS_KEYS//,/ }; do
    for side in redis noop-redis; do
      local tag=$side.$keys rport pport grpc http rpid ppid spid
      rport=$(free_port); pport=$(free_port); grpc=$(free_port); http=$(free_port)
      "$REDIS_SERVER" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no > "$dir/redis.$tag.log" 2>&1 & rpid=$!
      for _ in $(seq 300); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
      python3 scripts/redis-capture.py record "$pport" "$rport" "$dir/sent.$tag" 2> "$dir/proxy.$tag.log" & ppid=$!
      wait_port "$pport"
      serve_on_redis "$([ "$side" = noop-redis ] && echo noop-redis || echo "$BIN")" "$pport" "$grpc" "$http" "$dir/server.$tag.log"
      spid=$SERVED_PID
      "$LOAD" --drive 127.0.0.1:$grpc --calls "$calls" --keys "$keys" --shapes "$REDIS_SHAPE" > /dev/null
      redis-cli -p "$rport" info commandstats > "$dir/recorded.$tag"
      kill -TERM $spid; wait $spid || true
      kill -TERM $ppid; wait $ppid || true
      redis-cli -p "$rport" shutdown nosave > /dev/null 2>&1 || true; wait $rpid || true
      python3 scripts/redis-capture.py shift "$dir/sent.$tag" "$dir/replay.$tag" > /dev/null
      local runs=() r c0 c1
      for r in $(seq "$ROUNDS"); do # each time on a fresh redis-server
        rport=$(free_port)
        taskset -c 1 "$REDIS_SERVER" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no > "$dir/replay-redis.$tag.log" 2>&1 & rpid=$!
        for _ in $(seq 300); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
        c0=$(cpu "$rport")
        taskset -c 0 redis-cli -p "$rport" --pipe < "$dir/replay.$tag" > "$dir/pipe.$tag.log" 2>&1 || true  # (errors: the clients' CLIENT SETINFO, the conditional SET's probe)
        c1=$(cpu "$rport")
        redis-cli -p "$rport" info commandstats > "$dir/replayed.$tag"
        redis-cli -p "$rport" shutdown nosave > /dev/null 2>&1 || true; wait $rpid || true
        runs+=("$(python3 -c "print('%.2f' % (($c1 - $c0) * 1e6 / $calls))")")
      done
      local rec rep; rec=$(per_decision "$dir/recorded.$tag"); rep=$(per_decision "$dir/replayed.$tag")
      echo "| $keys | $([ $side = redis ] && echo ours || echo the baseline) | ${rec/ / \/ } | ${rep/ / \/ } | $(printf '%s\n' "${runs[@]}" | sort -n | awk '{v[NR] = $1} END {printf "%s [%s–%s]", v[int((NR + 1) / 2)], v[1], v[NR]}') |"
    done
  done
  echo "(recordings kept in $dir)"
}

case $MODE in
  load) load ;;
  callgrind) callgrind ;;
  redis) redis_cost ;;
  redis-ab) redis_ab ;;
  perf) perf_profile ;;
  syscalls) syscalls ;;
  wakeups) wakeups ;;
  commandstats) commandstats ;;
  capacity) capacity ;;
  all) load; callgrind ;;
  *) echo "usage: $0 [load|callgrind|redis|redis-ab|perf|syscalls|wakeups|commandstats|capacity|all]" >&2; exit 2 ;;
esac
