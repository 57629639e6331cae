#!/bin/bash
# exp29.sh OUTDIR: the GPU tests (gpu-check tests).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check-tests.log
echo "== end $(date +%T)"
