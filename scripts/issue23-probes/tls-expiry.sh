#!/bin/bash
# tls-expiry.sh BIN: (1) start with an expired certificate; (2) start with a good one, rotate to an
# expired one, then handshake; (3) the expiry metric.
BIN=$1; D=${PROBE_DIR:-/tmp/issue23-probe}/tlsx; rm -rf $D; mkdir -p $D; P=${PROBE_DIR:-/tmp/issue23-probe}
cp $P/expired.crt $D/tls.crt; cp $P/expired.key $D/tls.key
echo "-- start with an expired certificate (notAfter 2025-01-01):"
GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$D/tls.crt GRPC_SERVER_TLS_KEY=$D/tls.key timeout 3 $BIN serve --config $P/rules --grpc-addr 127.0.0.1:18281 --http-addr 127.0.0.1:18280 > $D/start.log 2>&1; echo "exit code $?"; grep -iE "error|expir|serving" $D/start.log | cut -c1-300
cp $P/good.crt $D/tls.crt; cp $P/good.key $D/tls.key
GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$D/tls.crt GRPC_SERVER_TLS_KEY=$D/tls.key $BIN serve --config $P/rules --grpc-addr 127.0.0.1:18281 --http-addr 127.0.0.1:18280 > $D/rot.log 2>&1 & PID=$!
sleep 1
echo "-- serving the good certificate; handshake:"; curl -s -o /dev/null -w 'curl %{http_code} ssl_verify=%{ssl_verify_result}\n' --http2-prior-knowledge --cacert $P/good.crt https://127.0.0.1:18281/ 2>&1 | tail -1
cp $P/expired.key $D/tls.key; cp $P/expired.crt $D/tls.crt
sleep 3.5
echo "-- after rotating to the expired certificate:"; grep -iE "tls|expir" $D/rot.log | cut -c1-250
curl -s -o /dev/null -w 'handshake against the good CA: curl exit %{exitcode} http %{http_code}\n' --cacert $P/good.crt https://127.0.0.1:18281/
curl -s http://127.0.0.1:18280/metrics | grep -E '^ratelimit_tls' 
kill $PID; wait $PID 2>/dev/null
