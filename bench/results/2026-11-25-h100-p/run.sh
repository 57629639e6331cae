#!/bin/bash
# exp9.sh OUTDIR: a fresh process's first load, with the device pool grown in one allocation first (this bundle,
# grow) against b516599's behaviour (touch: the wheel of old/, run with WEIGHTLIFT_EXP_TOUCH=1, the switch that
# build read); alternating, at 1 GiB and 4 GiB.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
new=$(mktemp -d); old=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $new $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --target $old $B/old/weightlift-*.whl >> $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
PYTHONPATH=$new timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$new timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
echo "== CLI $(date +%T)"
for f in $f1 $f4; do
  RUST_LOG=weightlift_io=debug,weightlift=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f > $O/cli-grow-$(basename $f .safetensors).txt 2>&1; echo "rc=$?"
done
grep -h "^loaded\|time: alloc\|pool" $O/cli-grow-*.txt
for i in 1 2 3; do
  for f in $f1 $f4; do
    n=$(basename $f .safetensors)
    for g in touch grow; do
      site=$new; [ $g = touch ] && site=$old
      env WEIGHTLIFT_EXP_TOUCH=1 PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
        --methods weightlift.load_file --out $O/first-$g-$n-$i.json > /dev/null 2> $O/logs/first-$g-$n-$i.log
      python3 - $O/first-$g-$n-$i.json $g $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        t=r['report_first']['times']
        print(sys.argv[2], sys.argv[3], 'first s', r['runs_s'], 'second s', [round(x,4) for x in r['second_load_s']], 'verified', r['verified'], 'alloc %.4f io %.4f setup %.4f wait %.4f deliver %.4f' % (t['alloc'], t['io'], t['staging_setup_thread_secs'], t['staging_wait_thread_secs'], t['deliver_thread_secs']), flush=True)
PY
    done
  done
done
echo "== end $(date +%T)"
