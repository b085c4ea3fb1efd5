#!/bin/bash
# rss-stall.sh BIN [--partial]: gRPC over TLS; 8,000 stalled handshakes (8 × 1,000 from
# 127.0.0.2..9), connected in parallel; RSS before, at the peak, and 15 s after they were closed.
BIN=$1; MODE=$2; P=${PROBE_DIR:-/tmp/issue23-probe}; D=$P/rss; rm -rf $D; mkdir -p $D
export GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$P/good.crt GRPC_SERVER_TLS_KEY=$P/good.key
rss() { grep VmRSS /proc/$1/status | awk '{printf "%.1f MB", $2/1024}'; }
$BIN serve --config $P/rules --grpc-addr 127.0.0.1:18781 --http-addr 127.0.0.1:18780 > $D/serve.log 2>&1 & PID=$!
sleep 1
echo "RSS before: $(rss $PID)"
PIDS=""
for i in 2 3 4 5 6 7 8 9; do $P/abuse tls-stall --addr 127.0.0.1:18781 --count 1000 --source 127.0.0.$i $MODE --hold 6 > $D/abuse-$i.log 2>&1 & PIDS="$PIDS $!"; done
peak=0; fds=0
while kill -0 $PIDS 2>/dev/null; do r=$(grep VmRSS /proc/$PID/status | awk '{print $2}'); f=$(ls /proc/$PID/fd | wc -l); [ $r -gt $peak ] && peak=$r; [ $f -gt $fds ] && fds=$f; sleep 0.2; done
wait $PIDS
echo "RSS peak while stalled: $(echo "scale=1; $peak/1024" | bc) MB (at most $fds fds)"
sleep 15
echo "RSS 15 s after they closed: $(rss $PID) ($(ls /proc/$PID/fd | wc -l) fds)"
kill $PID; wait $PID 2>/dev/null
