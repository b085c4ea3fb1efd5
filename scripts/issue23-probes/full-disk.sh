#!/bin/bash
# full-disk.sh BIN: serve with --record on a 64 KiB tmpfs (16 KiB of it taken by a filler file),
# send 2,000 /json decisions (20 at a time) to fill it, free the filler, send 10 more, then report: lines in the file, whole lines, a glued/partial line, the record metrics.
BIN=$1; D=${PROBE_DIR:-/tmp/issue23-probe}/fd; mkdir -p $D/mnt; umount $D/mnt 2>/dev/null
mount -t tmpfs -o size=64k tmpfs $D/mnt || exit 1
head -c 16384 /dev/zero > $D/mnt/filler
$BIN serve --config ${PROBE_DIR:-/tmp/issue23-probe}/rules --grpc-addr 127.0.0.1:18181 --http-addr 127.0.0.1:18180 --record $D/mnt/rec.jsonl > $D/serve.log 2>&1 & PID=$!
sleep 1
seq 1 2000 | xargs -P 20 -I{} curl -s -o /dev/null -XPOST -H 'Content-Type: application/json' --data '{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.{}"}]}]}' http://127.0.0.1:18180/json
sleep 1
# Space comes back (another file deleted); after the writer's retry pause, 10 more decisions.
rm $D/mnt/filler; sleep 1.5
seq 1 10 | xargs -P 1 -I{} curl -s -o /dev/null -XPOST -H 'Content-Type: application/json' --data '{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.0.{}"}]}]}' http://127.0.0.1:18180/json
sleep 0.5
curl -s http://127.0.0.1:18180/metrics | grep '^ratelimit_record'
python3 - $D/mnt/rec.jsonl <<'PY'
import json, sys
data = open(sys.argv[1], 'rb').read()
lines = data.split(b'\n')
tail = lines[-1]
whole = lines[:-1]
bad = 0
for l in whole:
    try: json.loads(l)
    except Exception: bad += 1
print(f"decisions sent: 2010; file: {len(data)} bytes, {len(whole)} newline-terminated lines, {bad} of them not valid JSON, {len(tail)} bytes after the last newline")
PY
kill $PID; wait $PID 2>/dev/null; umount $D/mnt
