#!/bin/bash
# exp7.sh OUTDIR: GPU decode rates per codec (the Huffman kernel as mended after review, nvCOMP from its wheel);
# warm Huffman-packed loads with the default decode batch (128 MiB) and 256 MiB, alternating twice; the
# packed-load bench.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
export WEIGHTLIFT_NVCOMP_LIB=$(find $site -name 'libnvcomp.so*' | sort | head -n 1)
echo "== decode rates $(date +%T)"
WEIGHTLIFT_BENCH_OUT=$O timeout 120 $B/bin/unpack-gpu-tests --ignored --nocapture bench_gpu_decompression > $O/logs/unpack-gpu.log 2>&1
echo "rc=$?"; grep -E "full path" $O/logs/unpack-gpu.log
echo "== pack settings $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 160 python3 $B/bench/pack_settings.py $O/settings --dir $S --variant "" \
  --variant "WEIGHTLIFT_PACK_BATCH_BYTES=256MiB" --variant "WL_ROUND=2" --variant "WL_ROUND=2 WEIGHTLIFT_PACK_BATCH_BYTES=256MiB" \
  > $O/logs/pack-settings.log 2>&1
echo "rc=$?"; grep -E "GB/s" $O/logs/pack-settings.log
echo "== pack-load bench $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 150 python3 $B/bench/pack_load_bench.py $O --dir $S > $O/logs/pack-load.log 2>&1
echo "rc=$?"; grep -E "summary" $O/logs/pack-load.log | tail -n 1
echo "== end $(date +%T)"
