#!/bin/bash
# run.sh OUTDIR: PyTorch's allocator backends under weightlift's loads into PyTorch's memory. bench/call_overhead.py
# on a warm 4.49 GB file, PyTorch's cache emptied before each load: PyTorch's default allocator, its
# cudaMallocAsync backend, its expandable segments, and weightlift's pool; twice, alternating. Then bench/shapes.py's
# warm, first-load and restart cases for weightlift.load_file under the default allocator and under cudaMallocAsync.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); R=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; df -h /root /dev/shm; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_SERVER=off
python3 -c "import torch; print('torch', torch.__version__)"
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"; cat $f > /dev/null
conf() { case $1 in torch-async) echo backend:cudaMallocAsync;; torch-expandable) echo expandable_segments:True;; *) echo "";; esac; }
for round in 1 2; do
  for v in torch torch-async torch-expandable pool; do
    echo "== call_overhead $v, round $round $(date +%T)"
    PYTORCH_CUDA_ALLOC_CONF=$(conf $v) WEIGHTLIFT_DEVICE_MEMORY=${v%%-*} timeout 100 python3 $B/bench/call_overhead.py \
      $f $R/call-overhead-$v-$round.json --runs 7 > $L/call-overhead-$v-$round.log 2>&1
    echo "rc=$?"; tail -n 1 $L/call-overhead-$v-$round.log | cut -c1-260
  done
done
tar czf $O/call-overhead.tgz -C $R .
for v in torch torch-async; do
  echo "== shapes $v $(date +%T)"
  PYTORCH_CUDA_ALLOC_CONF=$(conf $v) timeout 125 python3 $B/bench/shapes.py --file $f --device cuda:0 \
    --cases warm,first-load,restart --methods "weightlift.load_file" --time-limit 110 \
    --out $O/shapes-$v.json > /dev/null 2> $L/shapes-$v.log
  echo "shapes rc=$?"
  grep -E "best|goal|skip|stopped" $L/shapes-$v.log | grep -v "not measured" | tail -n 12
done
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
