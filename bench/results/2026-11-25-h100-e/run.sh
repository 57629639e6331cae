#!/bin/bash
# exp5.sh OUTDIR: the GPU tests (scripts/gpu-check tests; nvCOMP from its wheel); warm Huffman-packed loads with the
# default decode batch (128 MiB) and the former one (256 MiB), alternating twice (bench/pack_settings.py); the
# packed-load bench with ZipNN in the same run.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "rc=$?"; grep -E "test result|passed|FAILED|panicked|_rc" $O/logs/tests.log | tail -n 12
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
for sd in $B/peer-sdists/zipnn-*; do python3 -m pip install -q --no-index --no-deps --no-build-isolation --target $site $sd >> $O/logs/install.log 2>&1; done
export PYTHONPATH=$site
echo "== pack settings $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 140 python3 $B/bench/pack_settings.py $O/settings --dir $S --variant "" \
  --variant "WEIGHTLIFT_PACK_BATCH_BYTES=256MiB" --variant "WL_ROUND=2" --variant "WL_ROUND=2 WEIGHTLIFT_PACK_BATCH_BYTES=256MiB" \
  > $O/logs/pack-settings.log 2>&1
echo "rc=$?"; grep -E "GB/s" $O/logs/pack-settings.log
echo "== pack-load bench $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 140 python3 $B/bench/pack_load_bench.py $O --dir $S > $O/logs/pack-load.log 2>&1
echo "rc=$?"; grep -E "summary" $O/logs/pack-load.log | tail -n 1
echo "== end $(date +%T)"
