#!/bin/bash
# exp7.sh OUTDIR: the GPU tests, then packed loads with the defaults (plain, packed, verify interleaved), with and
# without a device cache.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 320 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/tests.log | tail -n 6
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
echo "== pack $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 230 python3 $B/bench/pack_settings.py $O --dir $S --variant "" --variant "WEIGHTLIFT_DEVICE_CACHE_BYTES=8GiB" > $O/logs/pack-settings.log 2>&1
tail -n 12 $O/logs/pack-settings.log
echo "== end $(date +%T)"
