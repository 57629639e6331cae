#!/bin/bash
# exp15.sh OUTDIR: the GPU tests at this commit (gpu-check tests), then a fresh process's first load with the
# tensors' memory from PyTorch's caching allocator (device_memory=torch, the default) or from the device's
# stream-ordered pool (WEIGHTLIFT_DEVICE_MEMORY=pool), alternating, at 1 GiB and 4 GiB (upstream files), and one
# CLI-free Python trace of each at 1 GiB.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 5 $O/logs/check.log; grep -h "passed\|failed" $O/check/logs/*.log 2>/dev/null | tail -5
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
for i in 1 2; do
  for f in $f1 $f4; do
    n=$(basename $f .safetensors)
    for g in torch pool; do
      WEIGHTLIFT_DEVICE_MEMORY=$g PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
        --methods weightlift.load_file --out $O/first-$g-$n-$i.json > /dev/null 2> $O/logs/first-$g-$n-$i.log
      python3 - $O/first-$g-$n-$i.json $g $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        rep=r['report_first']; t=rep.get('times',{})
        print(sys.argv[2], sys.argv[3], rep.get('device_memory'), 'first s', r['runs_s'], 'second s', [round(x,4) for x in r['second_load_s']], 'alloc', t.get('alloc'), flush=True)
PY
    done
  done
done
echo "== end $(date +%T)"
