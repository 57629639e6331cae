#!/bin/bash
# exp1.sh OUTDIR: the GPU tests; GPU decode rates per codec (weightlift's Huffman kernel beside nvCOMP's decoders);
# warm packed loads of a 4 GiB weight-like bf16 checkpoint packed with huffman (the new default) and with zstd.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|panicked|tests_rc" $O/logs/tests.log | tail -n 12
echo "== decode rates $(date +%T)"
WEIGHTLIFT_BENCH_OUT=$O timeout 90 $B/bin/unpack-gpu-tests --ignored --nocapture bench_gpu_decompression > $O/logs/unpack-gpu.log 2>&1
echo "rc=$?"; grep -E "full path|nvcomp" $O/logs/unpack-gpu.log | head -n 20
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
for c in huffman zstd; do
  echo "== pack $c $(date +%T)"
  WEIGHTLIFT_BIN=$B/bin/weightlift timeout 110 python3 $B/bench/pack_settings.py $O/$c --dir $S --variant "" --codec $c > $O/logs/pack-settings-$c.log 2>&1
  echo "rc=$?"; tail -n 8 $O/logs/pack-settings-$c.log
done
echo "== end $(date +%T)"
