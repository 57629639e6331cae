#!/bin/bash
# exp2.sh OUTDIR: GPU decode rates per codec (weightlift's Huffman kernel beside nvCOMP's decoders, nvCOMP from its
# wheel); the packed-load bench (cold and warm, packed and plain, disk and pinned ceilings, ratios) with the
# default codec (huffman); warm packed loads with the defaults again.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
export WEIGHTLIFT_NVCOMP_LIB=$(find $site -name 'libnvcomp.so*' | sort | head -n 1)
echo "nvcomp: $WEIGHTLIFT_NVCOMP_LIB"
echo "== decode rates $(date +%T)"
WEIGHTLIFT_BENCH_OUT=$O timeout 120 $B/bin/unpack-gpu-tests --ignored --nocapture bench_gpu_decompression > $O/logs/unpack-gpu.log 2>&1
echo "rc=$?"; grep -E "full path|nvcomp|skipping" $O/logs/unpack-gpu.log | head -n 20
echo "== pack-load bench $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 330 python3 $B/bench/pack_load_bench.py $O --dir $S > $O/logs/pack-load.log 2>&1
echo "rc=$?"; tail -n 3 $O/logs/pack-load.log
echo "== pack huffman $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 100 python3 $B/bench/pack_settings.py $O/huffman --dir $S --variant "" --codec huffman > $O/logs/pack-settings-huffman.log 2>&1
echo "rc=$?"; tail -n 4 $O/logs/pack-settings-huffman.log
echo "== end $(date +%T)"
