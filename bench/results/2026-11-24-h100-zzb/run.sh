#!/bin/bash
# run.sh OUTDIR: the GPU tests of the session's last code.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 340 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc|prepare" $O/logs/tests.log | tail -n 8
echo "== end $(date +%T)"
