#!/bin/bash
# exp14.sh OUTDIR: a fresh process's first load with device memory from the stream-ordered pool (cuMemAllocAsync, the
# default: pool) or from cuMemAlloc (plain, WEIGHTLIFT_EXP_PLAIN_ALLOC, an uncommitted switch of this build),
# alternating, at 1 GiB and 4 GiB; then one CLI load of each with the set-up's debug events.
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
    for g in pool plain; do
      env $([ $g = plain ] && echo WEIGHTLIFT_EXP_PLAIN_ALLOC=1) PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
        --methods weightlift.load_file --out $O/first-$g-$n-$i.json > /dev/null 2> $O/logs/first-$g-$n-$i.log
      python3 - $O/first-$g-$n-$i.json $g $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        t=r['report_first'].get('times',{})
        print(sys.argv[2], sys.argv[3], 'first s', r['runs_s'], 'second s', [round(x,4) for x in r['second_load_s']], 'alloc', t.get('alloc'), flush=True)
PY
    done
  done
done
echo "== CLI $(date +%T)"
for g in pool plain; do for f in $f1 $f4; do
  n=$(basename $f .safetensors)
  env $([ $g = plain ] && echo WEIGHTLIFT_EXP_PLAIN_ALLOC=1) NO_COLOR=1 RUST_LOG=weightlift=debug,weightlift_io=debug,weightlift_cuda=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f > $O/cli-$g-$n.txt 2>&1
  echo "$g $n rc=$?"; grep -h "^loaded\|time: alloc" $O/cli-$g-$n.txt
done; done
echo "== end $(date +%T)"
