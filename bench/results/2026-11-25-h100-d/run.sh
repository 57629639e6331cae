#!/bin/bash
# exp4.sh OUTDIR: the packed-load GPU tests; warm Huffman-packed loads with the read lanes and decode batch size
# varied (bench/pack_settings.py, the defaults first and last); the packed-load bench with ZipNN in the same run.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== packed tests $(date +%T)"
timeout 120 $B/bin/packed-tests --test-threads 1 > $O/logs/packed-tests.log 2>&1
echo "rc=$?"; grep -E "test result|FAILED|panicked|GPU decoder" $O/logs/packed-tests.log | head
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
for sd in $B/peer-sdists/zipnn-*; do python3 -m pip install -q --no-index --no-deps --no-build-isolation --target $site $sd >> $O/logs/install.log 2>&1; done
export PYTHONPATH=$site
echo "== pack settings $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 260 python3 $B/bench/pack_settings.py $O/settings --dir $S --variant "" \
  --variant "WEIGHTLIFT_PACK_READ_LANES=16" --variant "WEIGHTLIFT_PACK_BATCH_BYTES=128MiB" \
  --variant "WEIGHTLIFT_PACK_READ_LANES=16 WEIGHTLIFT_PACK_BATCH_BYTES=128MiB" --variant "WEIGHTLIFT_PACK_BATCH_BYTES=64MiB" \
  --variant "WEIGHTLIFT_PACK_READ_LANES=14" > $O/logs/pack-settings.log 2>&1
echo "rc=$?"; grep -E "GB/s" $O/logs/pack-settings.log
echo "== pack-load bench $(date +%T)"
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 220 python3 $B/bench/pack_load_bench.py $O --dir $S > $O/logs/pack-load.log 2>&1
echo "rc=$?"; grep -E "zipnn|summary" $O/logs/pack-load.log | tail -n 3
echo "== end $(date +%T)"
