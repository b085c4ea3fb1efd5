#!/usr/bin/env bash
# Issue 31, finding 1: a Redis Cluster master killed under racing load, the way it broke. Three
# masters with a replica each, cluster-node-timeout 2 s, two server processes × 16 in flight on
# three keys × 300/hour (one per master) plus traffic on 100k keys reaching every master; the
# first key's master is SIGKILLed mid-race. Prints the admitted per key (limit 300 each), the
# local decisions, hits written back, breaker switches and the failover time. RUNS=N repeats.
set -euo pipefail
cd "$(dirname "$0")/../.."
for _ in $(seq "${RUNS:-1}"); do
  CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" cargo test --test it \
    redis_cluster_failover:: -- --nocapture --test-threads=1 2>&1 | grep -E "3 keys|test result"
done
