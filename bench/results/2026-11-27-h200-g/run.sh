#!/bin/bash
# run.sh OUTDIR: bench/alloc_probe.py on the 4 GiB upstream file: warm GPU loads with the tensors' memory from
# PyTorch one block at a time, from one slab, and from weightlift's pool, each in fresh processes, alternating (the
# script's first version: its variant "slab" is the committed script's "slab-one").
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1
f=$S/upstream-4GiB.safetensors
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
echo "== alloc probe $(date +%T)"
timeout 400 python3 $B/bench/alloc_probe.py $f $O/alloc-probe.json --runs 5 --rounds 2 > $L/alloc-probe.log 2>&1
echo "probe rc=$?"; cat $L/alloc-probe.log | head -40
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
