#!/bin/bash
# exp10.sh OUTDIR: the shapes users meet beside the peers (gpu-check shapes, 1 GiB: the README's table), then the
# GPU tests (gpu-check tests) with the time left.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== shapes $(date +%T)"
WEIGHTLIFT_SHAPES_SIZE=1GiB WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check shapes > $O/logs/check-shapes.log 2>&1
echo "shapes rc=$?"; tail -n 45 $O/logs/check-shapes.log
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout $(( 585 - SECONDS - 5 )) bash $B/scripts/gpu-check $O/tests tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 20 $O/logs/check-tests.log
echo "== end $(date +%T)"
