#!/usr/bin/env bash
# Issue 33, item 4 (explain planned by the decision's plan): the decision benchmark before and after,
# quick runs. The base revision (default: main) is unpacked into a scratch directory and built into
# this checkout's target/ (the release dependencies are shared), saved as criterion baseline
# `before`; this checkout then runs against it, and criterion prints the change per benchmark.
# `decision` is the benchmark the brief names (memory store + algorithm); `engine` adds the whole
# decision through Engine (validate, plan::plan, key, store, response), the path the change touches.
# usage: scripts/issue33-probes/explain-bench.sh [BASE_REV]   (run from the repository root)
set -eu
BASE=${1:-main}
TARGET=$(pwd)/target
SCRATCH=$(mktemp -d /tmp/issue33-base.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
git archive "$BASE" | tar -x -C "$SCRATCH"
QUICK=(--warm-up-time 1 --measurement-time 3 --noplot)
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
echo "== before ($BASE)"
(cd "$SCRATCH" && CARGO_TARGET_DIR=$TARGET cargo bench --bench decision --bench engine -- \
    "${QUICK[@]}" --save-baseline before 2>&1 | grep -E '^[a-z_]+/|time:')
echo "== after ($(git rev-parse --short HEAD))"
cargo bench --bench decision --bench engine -- "${QUICK[@]}" --baseline before 2>&1 |
    grep -E '^[a-z_]+/|time:|change:|regressed|improved|No change|within noise'
