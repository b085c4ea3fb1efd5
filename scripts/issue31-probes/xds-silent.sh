#!/usr/bin/env bash
# Finding 9: an xDS management server that accepts the connection and never answers. Waits 20 s
# and prints the warnings logged and the ratelimit_xds_* series. usage: xds-silent.sh BIN
set -u
BIN=${1:?usage: xds-silent.sh BIN}
. "$(dirname "$0")/common.sh"
T=$(mktemp -d); trap 'stop; kill $SP 2>/dev/null; rm -rf "$T"' EXIT
XDS=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
held = []
while True:
    held.append(s.accept()[0])   # accepted, never read from or written to
' "$XDS" &
SP=$!
mkdir -p "$T/rules"
start "$BIN" "$T/log" "$T/rules" CONFIG_TYPE=GRPC_XDS_SOTW CONFIG_GRPC_XDS_SERVER_URL="127.0.0.1:$XDS"
sleep 20
echo "after 20 s: /healthcheck $(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$HTTP/healthcheck")"
echo "WARN lines: $(grep -c WARN "$T/log")"
grep WARN "$T/log" | cut -c1-240 | sed 's/^/    /'
curl -s "127.0.0.1:$HTTP/metrics" | grep '^ratelimit_xds' || echo "no ratelimit_xds_* series"
