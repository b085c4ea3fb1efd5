#!/usr/bin/env bash
# Issue 32: how long the image steps take. `cold` removes the cached bases, the bases' images
# and the build's cache mounts first (a fresh machine, apart from the host's cargo registry);
# `warm` runs them again as they are (a machine that keeps target/). Prints one line per step.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-warm}
if [ "$mode" = cold ]; then
  rm -rf "${BASES_DIR:-target/container-bases}" "${CACHE_DIR:-target/container-cache}"
  podman rmi -f localhost/ratelimit-server:dev 2>/dev/null || true
  podman images --format '{{.Repository}}:{{.Tag}}' | grep -E 'ratelimit-(builder|runtime)-base' |
    xargs -r podman rmi -f >/dev/null
fi
for step in bases build; do
  start=$(date +%s)
  bash scripts/container-image.sh "$step" >"target/timings-$step.log" 2>&1
  echo "$mode $step: $(( $(date +%s) - start )) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
done
