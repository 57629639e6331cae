#!/bin/bash
# exp22.sh OUTDIR: a fresh process's first load, timed step by step with dated debug events (firstprobe.py).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs" "$O/tl"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
for i in 1 2 3 4; do
  for arm in default prepare idle idleprepare; do
    PYTHONPATH=$site timeout 60 python3 $B/firstprobe.py $f1 $arm $O/probe-1GiB.jsonl $O/tl/1g-$arm-$i.log 2>> $O/logs/probe.err
  done
done
for i in 1 2; do
  for arm in default idle; do
    PYTHONPATH=$site timeout 60 python3 $B/firstprobe.py $f4 $arm $O/probe-4GiB.jsonl $O/tl/4g-$arm-$i.log 2>> $O/logs/probe.err
  done
done
echo "== end $(date +%T)"
