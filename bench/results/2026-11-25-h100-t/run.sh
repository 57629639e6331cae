#!/bin/bash
# exp13.sh OUTDIR: the GPU tests at this commit (gpu-check tests), then three fresh processes' first loads of a
# warm 1.25 GB upstream file with the set-up's debug events (weightlift load onto cuda:0).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 5 $O/logs/check.log
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
for i in 1 2 3; do
  NO_COLOR=1 RUST_LOG=weightlift=debug,weightlift_io=debug,weightlift_cuda=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f1 > $O/cli-upstream-1GiB-$i.txt 2>&1
  echo "$i rc=$?"; grep -h "^loaded\|time: alloc" $O/cli-upstream-1GiB-$i.txt
done
echo "== end $(date +%T)"
