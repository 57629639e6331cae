#!/bin/bash
# run.sh OUTDIR: whether what costs a load into PyTorch's fresh memory is the free before it. bench/fresh_memory_probe.py
# (the CUDA driver alone: copies into fresh and reused device memory, right after a free and 0.2 s later; two
# processes), then bench/call_overhead.py on a warm 4.49 GB file: PyTorch's memory with its cache emptied right
# before each load, the same with 0.5 s of waiting after emptying it, and weightlift's pool; twice, alternating.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); R=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
for i in 1 2; do
  echo "== fresh_memory_probe $i $(date +%T)"
  timeout 120 python3 $B/bench/fresh_memory_probe.py $R/fresh-memory-$i.json --gib 4 --rounds 5 --settle 0.2 \
    > $L/fresh-memory-$i.log 2>&1
  echo "rc=$?"; tail -n 2 $L/fresh-memory-$i.log
done
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_SERVER=off
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
for round in 1 2; do
  for v in torch torch-settled pool; do
    settle=0; [[ $v == *-settled ]] && settle=0.5
    echo "== call_overhead $v, round $round $(date +%T)"
    WEIGHTLIFT_DEVICE_MEMORY=${v%%-*} timeout 100 python3 $B/bench/call_overhead.py $f $R/call-overhead-$v-$round.json \
      --runs 7 --settle $settle > $L/call-overhead-$v-$round.log 2>&1
    echo "rc=$?"; tail -n 1 $L/call-overhead-$v-$round.log | cut -c1-200
  done
done
tar czf $O/results.tgz -C $R .
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
