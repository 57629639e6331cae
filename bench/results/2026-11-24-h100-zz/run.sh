#!/bin/bash
# run.sh OUTDIR: the shapes users meet beside the peers (gpu-check shapes, 1 GiB), and which tensors a BERT
# loaded by weightlift.transformers has off the device before its final move (diag_to.py, beside this script).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== diag $(date +%T)"
site=$(mktemp -d); python3 -m pip install --quiet --no-index --no-deps --target "$site" "$B"/wheels/weightlift-*.whl
PYTHONPATH=$site timeout 120 python3 $B/diag_to.py > $O/diag-to.json 2> $O/logs/diag.log; echo "diag rc=$?"; cut -c1-600 $O/diag-to.json
echo "== shapes $(date +%T)"
WEIGHTLIFT_SHAPES_SIZE=1GiB WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 500 bash $B/scripts/gpu-check $O/check shapes > $O/logs/check.log 2>&1
echo "rc=$?"; tail -n 45 $O/logs/check.log
echo "== end $(date +%T)"
