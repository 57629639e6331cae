#!/bin/bash
# exp18.sh OUTDIR: warm and tmpfs whole-file loads of a 1.25 GB upstream file, weightlift with device_memory torch
# (the default) and pool alternating, each invocation beside KvikIO (bench/shapes.py --cases warm,tmpfs).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --target $site $B/peer-wheels/*.whl >> $O/logs/install.log 2>&1
export PYTHONPATH=$site
f1=$S/upstream-1GiB.safetensors
timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
for i in 1 2; do for g in torch pool; do
  echo "== $g $i $(date +%T)"
  WEIGHTLIFT_DEVICE_MEMORY=$g timeout 120 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,tmpfs --runs 5 \
    --methods weightlift.load_file,kvikio --out $O/warm-tmpfs-$g-$i.json > /dev/null 2> $O/logs/warm-tmpfs-$g-$i.log
  echo "rc=$?"; grep -h "best" $O/logs/warm-tmpfs-$g-$i.log
done; done
echo "== end $(date +%T)"
