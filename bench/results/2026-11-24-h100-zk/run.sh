#!/bin/bash
# exp4.sh OUTDIR: the GPU tests, then what a fresh Python process's first load pays for: the engine's set-up (a
# small load first) and the device's first large allocation (4 GiB from the pool first).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 340 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; tail -n 15 $O/logs/tests.log
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== first loads $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 200 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 3 --variants none,warmup,pool:4GiB,warmup+pool:4GiB 2>&1 | tee $O/logs/first-load-alloc.log
echo "== end $(date +%T)"
