#!/bin/bash
# exp20.sh OUTDIR: the GPU tests at this commit (gpu-check tests).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 290 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 3 $O/logs/check.log; grep -h "test result" $O/check/logs/gpu-tests.log | head -12
echo "== end $(date +%T)"
