#!/bin/bash
# setup.sh: the fixtures the probes of issue 23 use, in $PROBE_DIR (default /tmp/issue23-probe):
# a rules directory, self-signed certificates (good, expired, not yet valid, expiring in 3 days)
# and the abuse and load example binaries. Run from the repository root after
#   cargo build --release --bin ratelimit-server --example abuse --example load
set -e
P=${PROBE_DIR:-/tmp/issue23-probe}; HERE=$(dirname "$0")
mkdir -p "$P/rules"
cat > "$P/rules/edge.yaml" <<'RULES'
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 300}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
RULES
cd "$P"
python3 "$OLDPWD/$HERE/mkcert.py" good 2025-01-01 2030-01-01
python3 "$OLDPWD/$HERE/mkcert.py" expired 2024-01-01 2025-01-01
python3 "$OLDPWD/$HERE/mkcert.py" future 2030-01-01 2031-01-01
python3 "$OLDPWD/$HERE/mkcert.py" soon 2025-01-01 "$(date -u -d '+3 days' +%Y-%m-%d)"
cd "$OLDPWD"
cp target/release/examples/abuse target/release/examples/load "$P/"
echo "fixtures in $P"
