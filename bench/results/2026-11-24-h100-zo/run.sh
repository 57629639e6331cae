#!/bin/bash
# exp9.sh OUTDIR: a fresh Python process's first load with nothing before it, after weightlift.prepare(device),
# and with weightlift.prepare(device) on a thread started before torch makes the CUDA context (interleaved).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== first loads $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 300 python3 $B/bench/first_load_alloc.py $f $O/first-load-prepare.json --runs 5 --variants none,prepare-thread,prepare 2>&1 | tee $O/logs/first-load-prepare.log
echo "== end $(date +%T)"
