#!/bin/bash
# exp3.sh OUTDIR: scripts/gpu-check's tests and pack parts from a bundle with the peers' wheels and ZipNN's source
# but without nvCOMP (packs of the default codec decode on the GPU without it; ZipNN's CPU decompression of the same
# file in the same run).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== check $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 575 bash $B/scripts/gpu-check $O/check tests pack > $O/logs/check.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|panicked|_rc|GB/s|ratio|zipnn|skipping" $O/logs/check.log | tail -n 40
echo "== end $(date +%T)"
