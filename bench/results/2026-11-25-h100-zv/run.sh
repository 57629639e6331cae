#!/bin/bash
# run.sh OUTDIR: gpu-check shapes, 1 GiB, with the peers: ceilings, shapes and goals of one run.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== shapes $(date +%T)"
WEIGHTLIFT_SHAPES_SIZE=1GiB WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 570 bash $B/scripts/gpu-check $O/check shapes > $O/logs/check-shapes.log 2>&1
echo "shapes rc=$?"; tail -n 75 $O/logs/check-shapes.log
echo "== end $(date +%T)"
