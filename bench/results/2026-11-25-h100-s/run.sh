#!/bin/bash
# exp12.sh OUTDIR: the first device allocations of a fresh process, by kind (pool_probe.py), three processes each,
# alternating; then the GPU tests at this commit.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
for i in 1 2 3; do for c in default small-first own-pool plain; do
  timeout 30 python3 $B/pool_probe.py $c >> $O/pool-probe.jsonl 2>> $O/logs/probe.log; echo "$c rc=$?"
done; done
cat $O/pool-probe.jsonl
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 5 $O/logs/check.log
echo "== end $(date +%T)"
