#!/bin/bash
# usage: scripts/measure-fd-exhaustion.sh BIN  — server under ulimit -n 256, 300 silent gRPC connections; CPU over 10 s and health
# needs: cargo build --release --example abuse; BIN is a built server (e.g. target/release/ratelimit-server)
BIN=$1
(ulimit -n 256; exec $BIN serve --config ${CONFIG:-config} --grpc-addr 127.0.0.1:18681 --http-addr 127.0.0.1:18680 >/tmp/ulimit-srv.log 2>&1) &
PID=$!
sleep 2
${ABUSE:-target/release/examples/abuse} silent --addr 127.0.0.1:18681 --count 300 --hold 25 --preface > /tmp/ulimit-abuse.log 2>&1 &
AB=$!
sleep 4
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
sleep 10
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "cpu over 10s: $(( (t1-t0) / 10 ))% of one core"
echo "health: $(curl -s -o /dev/null -m 3 -w '%{http_code} %{time_total}s' http://127.0.0.1:18680/healthcheck)"
wait $AB; cat /tmp/ulimit-abuse.log | tail -3
echo "health after: $(curl -s -o /dev/null -m 3 -w '%{http_code}' http://127.0.0.1:18680/healthcheck)"
pkill -9 -f "grpc-addr 127.0.0.1:18681"; wait; while ss -ltn | grep -q 18681; do sleep 1; done
