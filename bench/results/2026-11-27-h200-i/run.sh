#!/bin/bash
# run.sh OUTDIR: warm and tmpfs whole-file loads of the 4 GiB upstream file against the pinned copy, by where the tensors' device memory comes
# from: `weightlift bench --cases warm,tmpfs` (the Rust engine, its stream-ordered pool: the CLI's and the Rust
# library's default), then bench/shapes.py's warm and tmpfs cases for Python's `load_file` with PyTorch's memory (the
# Python default) and with `WEIGHTLIFT_DEVICE_MEMORY=pool`, alternating, each run measuring its own ceilings.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 WEIGHTLIFT_CACHE=$S/cache
f=$S/upstream-4GiB.safetensors
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $L/make.log
echo "make rc=$?"
echo "== weightlift bench $(date +%T)"
timeout 150 $B/bin/weightlift bench $f --device cuda:0 --cases warm,tmpfs --runs 5 --out $O/bench.json \
  > $L/bench.log 2>&1
echo "bench rc=$?"; grep -iE "warm|tmpfs|ceiling|pinned" $L/bench.log | tail -n 12
for round in 1 2; do
  for mem in torch pool; do
    echo "== shapes, device_memory=$mem, round $round $(date +%T)"
    WEIGHTLIFT_DEVICE_MEMORY=$mem timeout 100 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases warm,tmpfs \
      --methods "weightlift.load_file" --runs 5 --out $O/shapes-$mem-$round.json > /dev/null 2> $L/shapes-$mem-$round.log
    echo "shapes rc=$?"; grep -E "goal" $L/shapes-$mem-$round.log | grep -v "not measured"
  done
done
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
