#!/bin/bash
# run.sh OUTDIR: as -k (bench/call_overhead.py with PyTorch's memory, its cache emptied before each load or kept, and
# with weightlift's pool; twice, alternating), the script now keeping the engine report's times of each load: where
# in the engine the PyTorch-memory loads lose their time.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_SERVER=off
f=$S/upstream-4GiB.safetensors
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
for round in 1 2; do
  for v in torch torch-keep pool; do
    mem=${v%-keep}; keep=(); [[ $v == *-keep ]] && keep=(--keep-cache)
    echo "== $v, round $round $(date +%T)"
    WEIGHTLIFT_DEVICE_MEMORY=$mem timeout 120 python3 $B/bench/call_overhead.py $f $O/call-overhead-$v-$round.json \
      --runs 7 "${keep[@]}" > $L/call-overhead-$v-$round.log 2>&1
    echo "rc=$?"; tail -n 1 $L/call-overhead-$v-$round.log
  done
done
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
