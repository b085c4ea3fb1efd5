#!/bin/bash
# uds.sh BIN: the server with --grpc-uds under a 1,024-descriptor limit; 1,100 silent Unix-socket
# connections; meanwhile CPU over 5 s with no client active, a TCP gRPC call, /healthcheck; then how
# many of the silent connections the server closed (HANDSHAKE_TIMEOUT 10 s, IDLE_TIMEOUT 2 m).
BIN=$1; P=${PROBE_DIR:-/tmp/issue23-probe}; D=$P/uds; rm -rf $D; mkdir -p $D
prlimit --nofile=1024:1024 $BIN serve --config $P/rules --grpc-addr 127.0.0.1:18381 --http-addr 127.0.0.1:18380 --grpc-uds $D/rls.sock > $D/serve.log 2>&1 & PID=$!
sleep 1
$P/abuse silent-uds --path $D/rls.sock --count 1100 --hold 45 > $D/abuse.log 2>&1 & A=$!
sleep 4
echo "server fds: $(ls /proc/$PID/fd | wc -l)"
cpu() { awk '{print $14+$15}' /proc/$PID/stat; }
c0=$(cpu); sleep 5; c1=$(cpu); echo "server CPU with no client active: $(( (c1-c0) * 100 / 500 ))% of a core (5 s)"
/usr/bin/time -f "TCP gRPC call: %e s, exit %x" timeout 10 $BIN query --server http://127.0.0.1:18381 --domain edge api_key=k1 2>&1 | tail -1
curl -s -o /dev/null -m 10 -w "/healthcheck: %{http_code} in %{time_total} s\n" http://127.0.0.1:18380/healthcheck || echo "/healthcheck: no answer in 10 s"
wait $A; cat $D/abuse.log
grep -ciE "too many open files|accept" $D/serve.log | sed 's/^/server log lines about accept: /'
grep -iE "cap|accept" $D/serve.log | head -3 | cut -c1-220
kill $PID; wait $PID 2>/dev/null
