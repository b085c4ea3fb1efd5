#!/bin/bash
# rotate.sh BIN: --record with 1 KiB files and --record-max-files 1000, the 1,000 rotated files
# already there; 8 clients send 4,000 calls each (32,000 decisions); then lines written,
# dropped, rotations, and lines per second while rotating.
BIN=$1; P=${PROBE_DIR:-/tmp/issue23-probe}; D=$P/rot; rm -rf $D; mkdir -p $D/rec
line='{"v":1,"time":"2026-12-01T05:00:00Z","domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"old"}]}],"decision":{"code":"OK","statuses":["OK"]}}'
for n in $(seq 1 1000); do echo "$line" > $D/rec/rec.jsonl.$n; done
$BIN serve --config $P/rules --grpc-addr 127.0.0.1:18581 --http-addr 127.0.0.1:18580 --record $D/rec/rec.jsonl --record-max-bytes 1KiB --record-max-files 1000 > $D/serve.log 2>&1 & PID=$!
sleep 1
start=$(date +%s.%N)
PIDS=""; for c in 1 2 3 4 5 6 7 8; do $BIN query --server 127.0.0.1:18581 --domain edge --repeat 4000 remote_address=10.0.0.$c > /dev/null 2>&1 & PIDS="$PIDS $!"; done
wait $PIDS
sent=$(date +%s.%N)
# Let the writer finish what it has.
prev=-1; while true; do cur=$(curl -s http://127.0.0.1:18580/metrics | awk '/^ratelimit_record_lines_total/{print $2}'); [ "$cur" = "$prev" ] && break; prev=$cur; sleep 1; done
done_at=$(date +%s.%N)
curl -s http://127.0.0.1:18580/metrics | grep -E '^ratelimit_record_(lines|rotations|dropped)'
lines=$(curl -s http://127.0.0.1:18580/metrics | awk '/^ratelimit_record_lines_total/{print $2}')
echo "32000 decisions sent in $(echo "$sent - $start" | bc) s; $lines lines written, $(echo "scale=0; $lines / ($done_at - $start - 1)" | bc) lines/s until the writer was done"
echo "files kept: $(ls $D/rec | wc -l)"
kill $PID; wait $PID 2>/dev/null
