#!/bin/bash
# run.sh OUTDIR: bench/call_overhead.py on the 4 GiB upstream file: where a warm Python load_file onto cuda:0 spends
# the time outside the engine's clock, with PyTorch's memory (the default) and with weightlift's pool.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_SERVER=off
f=$S/upstream-4GiB.safetensors
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
for mem in torch pool; do
  echo "== device_memory=$mem $(date +%T)"
  WEIGHTLIFT_DEVICE_MEMORY=$mem timeout 120 python3 $B/bench/call_overhead.py $f $O/call-overhead-$mem.json --runs 7 \
    > $L/call-overhead-$mem.log 2>&1
  echo "rc=$?"; tail -n 8 $L/call-overhead-$mem.log
done
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
