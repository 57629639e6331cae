#!/bin/bash
# exp13.sh OUTDIR: the GPU tests, then a fresh Python process's first load with nothing before, after weightlift.prepare, and with weightlift.prepare on a thread started before torch makes the context.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 340 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/tests.log | tail -n 5
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== first loads $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 150 python3 $B/bench/first_load_alloc.py $f $O/first-load-prepare.json --runs 5 --variants none,prepare,prepare-thread 2>&1 | tee $O/logs/first-load-prepare.log
echo "== end $(date +%T)"
