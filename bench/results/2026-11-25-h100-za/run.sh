#!/bin/bash
# exp19.sh OUTDIR: the GPU tests at this commit (gpu-check tests); cuMemHostRegister of 128 MiB in a fresh process,
# 16 calls of 8 MiB (as the lanes pin) or one (pin_probe.py, three processes per case); warm and tmpfs loads with
# device_memory torch and pool alternating beside KvikIO; first loads with torch and pool at 1 GiB and 4 GiB.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 280 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 3 $O/logs/check.log
echo "== pins $(date +%T)"
for i in 1 2 3; do for c in split one split-after-one; do timeout 30 python3 $B/pin_probe.py $c | tee -a $O/pin-probe.jsonl; done; done
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --target $site $B/peer-wheels/*.whl >> $O/logs/install.log 2>&1
export PYTHONPATH=$site
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
for i in 1 2; do for g in torch pool; do
  echo "== warm/tmpfs $g $i $(date +%T)"
  WEIGHTLIFT_DEVICE_MEMORY=$g timeout 120 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,tmpfs --runs 5 \
    --methods weightlift.load_file,kvikio --out $O/warm-tmpfs-$g-$i.json > /dev/null 2> $O/logs/warm-tmpfs-$g-$i.log
  echo "rc=$?"; grep -h "best" $O/logs/warm-tmpfs-$g-$i.log
done; done
timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
for f in $f1 $f4; do
  n=$(basename $f .safetensors)
  for g in torch pool; do
    [ $SECONDS -gt 540 ] && break
    WEIGHTLIFT_DEVICE_MEMORY=$g timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
      --methods weightlift.load_file --out $O/first-$g-$n.json > /dev/null 2> $O/logs/first-$g-$n.log
    python3 - $O/first-$g-$n.json $g $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        rep=r['report_first']; t=rep.get('times',{})
        print(sys.argv[2], sys.argv[3], rep.get('device_memory'), 'first s', r['runs_s'], 'second s', [round(x,4) for x in r['second_load_s']], 'alloc', t.get('alloc'), flush=True)
PY
  done
done
echo "== end $(date +%T)"
