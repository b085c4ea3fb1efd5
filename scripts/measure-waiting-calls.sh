#!/bin/bash
# usage: scripts/measure-waiting-calls.sh BIN — 20 (CONNECTIONS) connections x 1,024 calls that send their
# headers and the 5-byte gRPC prefix, never the rest: the server's RSS at start, once all are
# open and 5 s later, and after they were ended; what they were answered 0.5 s after the last opened; the refusals
# counted (docs/operations.md, "A call is bounded before it is decoded").
# needs: cargo build --release --example abuse; BIN is a built server (e.g. target/release/ratelimit-server)
BIN=$1
ABUSE=${ABUSE:-target/release/examples/abuse}
SHUTDOWN_DELAY=0s $BIN serve --config ${CONFIG:-config} --grpc-addr 127.0.0.1:18791 --http-addr 127.0.0.1:18790 >/tmp/waiting-srv.log 2>&1 &
PID=$!
sleep 1.5
rss() { awk '/VmRSS/ {printf "%.0f MB", $2 / 1024}' /proc/$PID/status; }
echo "RSS at start: $(rss)"
$ABUSE stalled-streams --addr 127.0.0.1:18791 --connections ${CONNECTIONS:-20} --streams 1024 --declared 100 --send 0 --hold 15 >/tmp/waiting-abuse.log &
abuse=$!
until grep -q opened /tmp/waiting-abuse.log; do sleep 0.2; done
cat /tmp/waiting-abuse.log
echo "RSS with them open: $(rss); 5 s later: $(sleep 5; rss)"
wait $abuse
echo "RSS after: $(rss)"
curl -s 127.0.0.1:18790/metrics | grep -E '^ratelimit_service_should_rate_limit_error\{err_type="(resource_exhausted|stalled_request)"'
kill $PID; wait 2>/dev/null
