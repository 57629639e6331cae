#!/bin/bash
# exp11.sh OUTDIR: the GPU tests, then where opening a pack inside a run of loads loses its time
# (bench/pack_open_timing.py on a pack of the 4 GiB save_file checkpoint).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 340 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/tests.log | tail -n 5
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== pack $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 120 $B/bin/weightlift pack $f $S/upstream-4GiB.wlpack > $O/logs/pack.log 2>&1; tail -n 2 $O/logs/pack.log
timeout 150 python3 $B/bench/pack_open_timing.py $S/upstream-4GiB.wlpack $O/pack-open-timing.json 2>&1 | tee $O/logs/pack-open-timing.log
echo "== end $(date +%T)"
