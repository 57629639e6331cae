#!/bin/bash
# exp17.sh OUTDIR: allocprobe.py on a warm 1.25 GB upstream file, twice (two processes).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f1=$S/upstream-1GiB.safetensors
timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
for i in 1 2; do echo "== process $i"; timeout 120 python3 $B/allocprobe.py $f1 2>&1 | tee $O/allocprobe-$i.jsonl; done
