#!/bin/bash
# exp11.sh OUTDIR: where a fresh process's first load spends its time: `weightlift load` onto cuda:0 of a warm
# 1.25 GB and a warm 4.49 GB file written by safetensors.torch.save_file, three fresh processes each, with the
# engine's debug events (lanes joining, staging set up, slow deliveries, allocations published).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
for i in 1 2 3; do
  for f in $f1 $f4; do
    n=$(basename $f .safetensors)
    NO_COLOR=1 RUST_LOG=weightlift=debug,weightlift_io=debug,weightlift_cuda=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f > $O/cli-$n-$i.txt 2>&1
    echo "$n $i rc=$?"; grep -h "^loaded\|time: alloc" $O/cli-$n-$i.txt
  done
done
echo "== end $(date +%T)"
