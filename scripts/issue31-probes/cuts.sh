#!/usr/bin/env bash
# Issue 31, findings 4 and 8: replies lost on the way back from Redis. A real redis-server behind a
# proxy that loses 2 % of its replies and cuts their connections (the commands ran, their callers
# never heard), the real server binary at the defaults, 16 × 250 requests over 40 keys with a limit
# far above them: prints, per REDIS_FAILURE_MODE (deny, error), the requests admitted, answered by
# the failure mode / UNAVAILABLE, the hits Redis holds (charged once: = admitted), the breaker's
# switches, the resent calls and the cuts. RUNS=N repeats.
set -euo pipefail
cd "$(dirname "$0")/../.."
for _ in $(seq "${RUNS:-1}"); do
  CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" cargo test --test it redis_lost_replies:: -- \
    --nocapture --test-threads=1 2>&1 | grep -E "replies lost|test result"
done
