#!/bin/bash
# run.sh OUTDIR: the GPU tests, then time to a ready transformers model (gpu-check parts tests and models).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests+models $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 560 bash $B/scripts/gpu-check $O/check tests models > $O/logs/check.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/check.log | tail -n 8
tail -n 60 $O/logs/check.log
echo "== end $(date +%T)"
