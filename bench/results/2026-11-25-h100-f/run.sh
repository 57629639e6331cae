#!/bin/bash
# exp6.sh OUTDIR: the GPU tests at this commit (scripts/gpu-check tests; nvCOMP from its wheel).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "rc=$?"; grep -E "test result|passed|FAILED|panicked|_rc" $O/logs/tests.log | tail -n 12
echo "== end $(date +%T)"
