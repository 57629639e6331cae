#!/bin/bash
# exp10.sh OUTDIR: the GPU tests, then what handing loaded buffers to torch costs per tensor (a 4 GiB save_file
# checkpoint of 102 tensors and 2,000 small bf16 tensors), then packed loads with the defaults.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 340 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/tests.log | tail -n 5
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== handover $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 60 python3 $B/bench/handover.py $O/handover-4GiB.json $f 2>&1 | tee $O/logs/handover.log
timeout 60 python3 $B/bench/handover.py $O/handover-2000.json 2>&1 | tee -a $O/logs/handover.log
echo "== pack $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 150 python3 $B/bench/pack_settings.py $O --dir $S --variant "" > $O/logs/pack-settings.log 2>&1
tail -n 8 $O/logs/pack-settings.log
echo "== end $(date +%T)"
