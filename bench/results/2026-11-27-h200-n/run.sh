#!/bin/bash
# run.sh OUTDIR: gpu-check tests at this bundle's commit, whose GPU loads read and allocate their smallest blocks
# first (read_order=small-first, the new default); then the read order's effect on a warm 4.49 GB load into
# PyTorch's memory with its cache emptied before each load (bench/call_overhead.py, small-first and file
# alternating, twice), and on one-shot CLI loads (pool memory, a fresh process each, three of each order).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; df -h /root /dev/shm; } > $L/machine.txt 2>&1
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 290 bash $B/scripts/gpu-check $O/check tests > $L/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 16 $L/check-tests.log; grep -hE "FAILED|panicked|passed|failed" $O/check/logs/*.log | tail -n 25
tar czf $O/check-logs.tgz -C $O/check logs && rm -rf $O/check/logs
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_SERVER=off
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
for round in 1 2; do
  for order in small-first file; do
    echo "== call_overhead $order, round $round $(date +%T)"
    WEIGHTLIFT_READ_ORDER=$order WEIGHTLIFT_DEVICE_MEMORY=torch timeout 100 python3 $B/bench/call_overhead.py $f \
      $O/call-overhead-$order-$round.json --runs 7 > $L/call-overhead-$order-$round.log 2>&1
    echo "rc=$?"; tail -n 1 $L/call-overhead-$order-$round.log
  done
done
for i in 1 2 3; do
  for order in small-first file; do
    WEIGHTLIFT_READ_ORDER=$order timeout 60 $B/bin/weightlift load $f --device cuda:0 --no-ceiling --json \
      > $O/cli-$order-$i.json 2> $L/cli-$order-$i.log
    echo "cli $order $i rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('seconds'), r.get('gbps'), r.get('read_order'))" $O/cli-$order-$i.json 2>&1 | tail -n 1)"
  done
done
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
