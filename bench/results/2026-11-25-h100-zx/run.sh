#!/bin/bash
# run.sh OUTDIR: gpu-check tests.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 540 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 14 $O/logs/check-tests.log; grep -E "test_server|FAILED|ERROR" $O/check/logs/python-tests.log | head -20
echo "== end $(date +%T)"
