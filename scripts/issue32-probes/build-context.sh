#!/usr/bin/env bash
# Issue 32: does the Docker build context hold what the image's build needs? Copies exactly what
# `docker build .` would send (git's tracked files minus .dockerignore, Docker's matching rules:
# /work/shared/tools/docker-context.py, or DOCKER_CONTEXT_PY) into a temporary directory, checks
# every COPY source of the Dockerfile is there, and has cargo load the workspace from the copy
# (`cargo metadata --no-deps --locked --offline`: every member's manifest and every declared
# target's source; the dependencies are the real build's to fetch). Exits non-zero when anything
# is missing. Before the fix: "failed to load manifest for workspace member crates/core".
set -euo pipefail
cd "$(dirname "$0")/../.."
tool=${DOCKER_CONTEXT_PY:-/work/shared/tools/docker-context.py}
[ -f "$tool" ] || tool=scripts/issue32-probes/docker-context.py
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
python3 "$tool" . "$ctx"
if ! out=$(cd "$ctx" && cargo metadata --no-deps --locked --offline --format-version 1 2>&1 >/dev/null); then
  echo "build context: cargo cannot load the workspace from it:" >&2
  echo "$out" >&2
  exit 1
fi
members=$(cd "$ctx" && cargo metadata --locked --offline --no-deps --format-version 1 |
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workspace_members"]))')
echo "build context: cargo loads the workspace ($members members) from $(find "$ctx" -type f | wc -l) files: OK"
