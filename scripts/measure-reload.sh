#!/bin/bash
# Reloads, CPU and RSS of a server in the 60 s after one `cat` of its rules file (issue 10, finding 2).
# usage: scripts/measure-reload.sh BIN NAME small|big GRPC_PORT HTTP_PORT  (files under /tmp/meas/NAME)
BIN=$1; NAME=$2; SIZE=$3; GP=$4; HP=$5
D=/tmp/meas/$NAME; rm -rf $D; mkdir -p $D/rules
if [ $SIZE = small ]; then
  printf 'domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n' > $D/rules/x.yaml
else
  python3 -c "
import sys
out=['domain: x','descriptors:']
for i in range(75000):
    out.append(f'  - key: k\n    value: v{i:06d}\n    rate_limit: {{unit: second, requests_per_unit: 5}}')
open('$D/rules/x.yaml','w').write('\n'.join(out)+'\n')"
fi
ls -l $D/rules/x.yaml > $D/size
$BIN serve --config $D/rules --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP 2> $D/log &
PID=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:$HP/readyz >/dev/null && break; sleep 0.1; done
sleep 1
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
cat $D/rules/x.yaml > /dev/null
sleep 60
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
RSS=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
HWM=$(awk '/VmHWM/{print $2}' /proc/$PID/status)
SUCC=$(curl -s http://127.0.0.1:$HP/metrics | awk '$1=="ratelimit_service_config_load_success"{print $2}')
LOADED=$(grep -c "rules loaded" $D/log)
kill $PID; wait $PID 2>/dev/null
echo "$NAME: size=$(awk '{print $5}' $D/size) rules_loaded_lines=$LOADED config_load_success=$SUCC cpu_s_60s=$(echo "scale=2; ($T1-$T0)/$(getconf CLK_TCK)" | bc) rss_kb=$RSS hwm_kb=$HWM"
