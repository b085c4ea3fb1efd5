#!/bin/bash
# tls-stall.sh BIN: gRPC over TLS, MAX_CONNECTIONS=500. (a) 500 stalled handshakes from
# 127.0.0.2, then a real TLS client from 127.0.0.1 (curl, HTTP/2): its time. (b) 8,000 stalled
# handshakes (partial ClientHello, from 127.0.0.2..127.0.0.9, MAX_CONNECTIONS=10000): RSS before,
# during, and after they are closed.
BIN=$1; P=${PROBE_DIR:-/tmp/issue23-probe}; D=$P/tlsstall; rm -rf $D; mkdir -p $D
export GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$P/good.crt GRPC_SERVER_TLS_KEY=$P/good.key
rss() { grep VmRSS /proc/$1/status | awk '{printf "%.1f MB", $2/1024}'; }
MAX_CONNECTIONS=500 $BIN serve --config $P/rules --grpc-addr 127.0.0.1:18481 --http-addr 127.0.0.1:18480 > $D/a.log 2>&1 & PID=$!
sleep 1
$P/abuse tls-stall --addr 127.0.0.1:18481 --count 500 --source 127.0.0.2 --hold 12 > $D/abuse-a.log 2>&1 & A=$!
sleep 2
curl -s -o /dev/null -m 20 --http2 --cacert $P/good.crt -w "real client from 127.0.0.1 during 500 stalled handshakes: TLS done after %{time_appconnect} s, answered (HTTP %{http_code}) after %{time_total} s\n" https://127.0.0.1:18481/ || echo "real client: no answer in 20 s"
wait $A; kill $PID; wait $PID 2>/dev/null
$BIN serve --config $P/rules --grpc-addr 127.0.0.1:18481 --http-addr 127.0.0.1:18480 > $D/b.log 2>&1 & PID=$!
sleep 1
echo "RSS before: $(rss $PID)"
PIDS=""
for i in 2 3 4 5 6 7 8 9; do $P/abuse tls-stall --addr 127.0.0.1:18481 --count 1000 --source 127.0.0.$i --partial --hold 9 > $D/abuse-b$i.log 2>&1 & PIDS="$PIDS $!"; done
sleep 6
echo "RSS with 8,000 stalled handshakes: $(rss $PID) ($(ls /proc/$PID/fd | wc -l) fds)"
wait $PIDS
sleep 12
echo "RSS after they closed (12 s later): $(rss $PID) ($(ls /proc/$PID/fd | wc -l) fds)"
kill $PID; wait $PID 2>/dev/null
