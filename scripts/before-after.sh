#!/usr/bin/env bash
# Before/after figures in one run (issue 24): replay speed, the decision benchmark, the load
# ratios, and instructions per decision under callgrind (the noise-free one on a shared machine).
# usage: BEFORE=../older-checkout [AFTER=.] scripts/before-after.sh   (both built with
#   cargo build --release --bin ratelimit-server --example replay_speed --example load --example decisions
#   cargo bench --bench decision --no-run)
set -u
B=${BEFORE:?set BEFORE to the older checkout}/target/release
A=${AFTER:-.}/target/release
echo "== replay_speed (1M lines, 10k keys)"
for v in before after; do
  d=$([ $v = before ] && echo $B || echo $A)
  echo "-- $v"; $d/examples/replay_speed --lines 1000000 --keys 10000 2>&1 | tail -6
done
echo "== decision bench"
for v in before after; do
  d=$([ $v = before ] && echo $BEFORE || echo ${AFTER:-.})
  bin=$(ls $d/target/release/deps/decision-* | grep -v '\.d$' | xargs ls -t | head -1)
  echo "-- $v ($bin)"; (cd $d && $bin --bench --warm-up-time 1 --measurement-time 3 --noplot 2>&1 | grep -E 'time:|^[a-z_/0-9]+ *$|^[a-z]' | head -40)
done
echo "== load (memory backend, vs the no-op tonic server)"
for v in before after; do
  echo "-- $v"; (cd ${AFTER:-.} && $A/examples/load --duration 2 --rounds 3 --keys 1,100k-zipf --shapes 1x1,1x16,4x64,4x512 --server-bin $([ $v = before ] && echo $B || echo $A)/ratelimit-server 2>&1 | tail -14)
done
echo "== instructions per decision (callgrind; a --decisions 0 run subtracted)"
ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | grep 'Collected' | awk '{print $4}' | tr -d ,; }
for v in before after; do
  d=$([ $v = before ] && echo $B || echo $A)/examples/decisions
  for alg in token_bucket sliding_window; do
    for keys in 1 100000; do
      full=$(ir $d --algorithm $alg --keys $keys --decisions 1000000)
      base=$(ir $d --algorithm $alg --keys $keys --decisions 0)
      echo "$v $alg keys=$keys: $(( (full - base) / 1000000 )) instructions/decision"
    done
  done
done
