#!/bin/bash
# usage: scripts/measure-flood.sh BIN  (EXTRA_ENV=MAX_REQUEST_BYTES=8MiB to let the wire pre-scan refuse) — 16 senders x 10 rounds of 4 MB / 2M-empty-descriptor calls; server CPU seconds and peak RSS
# needs: cargo build --release --example abuse; BIN is a built server (e.g. target/release/ratelimit-server)
BIN=$1
${EXTRA_ENV:+env $EXTRA_ENV} $BIN serve --config ${CONFIG:-config} --grpc-addr 127.0.0.1:18691 --http-addr 127.0.0.1:18690 >/tmp/flood-srv.log 2>&1 &
PID=$!
sleep 1.5
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
s0=$(date +%s.%N)
${ABUSE:-target/release/examples/abuse} descriptor-flood --addr 127.0.0.1:18691 --senders 16 --rounds 10 2>&1 | tail -2
s1=$(date +%s.%N)
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "server CPU: $(echo "($t1-$t0)/100" | bc -l | cut -c1-5) s over $(echo "$s1-$s0" | bc -l | cut -c1-5) s wall; $(grep -E 'VmHWM|VmRSS' /proc/$PID/status | tr -s ' \n' ' ')"
kill -9 $PID; wait 2>/dev/null
