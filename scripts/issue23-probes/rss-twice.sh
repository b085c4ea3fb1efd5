#!/bin/bash
# rss-twice.sh BIN: gRPC over TLS; two floods of 8,000 silent connections (8 × 1,000 from
# 127.0.0.2..9), one after the other: RSS before, after the first, after the second.
BIN=$1; P=${PROBE_DIR:-/tmp/issue23-probe}; D=$P/rss2; rm -rf $D; mkdir -p $D
export GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$P/good.crt GRPC_SERVER_TLS_KEY=$P/good.key
rss() { grep VmRSS /proc/$1/status | awk '{printf "%.1f MB", $2/1024}'; }
$BIN serve --config $P/rules --grpc-addr 127.0.0.1:18881 --http-addr 127.0.0.1:18880 > $D/serve.log 2>&1 & PID=$!
sleep 1
echo "RSS before: $(rss $PID)"
for round in 1 2; do
  PIDS=""
  for i in 2 3 4 5 6 7 8 9; do $P/abuse tls-stall --addr 127.0.0.1:18881 --count 1000 --source 127.0.0.$i --hold 6 > $D/abuse-$round-$i.log 2>&1 & PIDS="$PIDS $!"; done
  wait $PIDS; sleep 12
  echo "RSS after flood $round closed: $(rss $PID) ($(ls /proc/$PID/fd | wc -l) fds)"
done
kill $PID; wait $PID 2>/dev/null
