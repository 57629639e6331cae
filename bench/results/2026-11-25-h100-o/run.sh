#!/bin/bash
# exp8.sh OUTDIR: a fresh process's first load with the lanes' staging faulted in by MADV_POPULATE_WRITE (populate)
# or by touching each page (touch, WEIGHTLIFT_EXP_TOUCH), both mapped at once and pinned one lane at a time, and
# the fully serial set-up of 3e15bcd (serial, old/); alternating, at 1 GiB and 4 GiB.
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
echo "== CLI debug $(date +%T)"
RUST_LOG=weightlift_io=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f1 > $O/cli-populate.txt 2>&1; echo "rc=$?"
WEIGHTLIFT_EXP_TOUCH=1 RUST_LOG=weightlift_io=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f1 > $O/cli-touch.txt 2>&1; echo "rc=$?"
grep -h "time: alloc" $O/cli-*.txt
for i in 1 2 3; do
  for f in $f1 $f4; do
    n=$(basename $f .safetensors)
    for g in serial populate touch; do
      site=$new; [ $g = serial ] && site=$old
      env $([ $g = touch ] && echo WEIGHTLIFT_EXP_TOUCH=1) PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
        --methods weightlift.load_file --out $O/first-$g-$n-$i.json > /dev/null 2> $O/logs/first-$g-$n-$i.log
      python3 - $O/first-$g-$n-$i.json $g $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        t=r['report_first']['times']
        print(sys.argv[2], sys.argv[3], 'first s', r['runs_s'], 'second s', [round(x,4) for x in r['second_load_s']], 'alloc %.4f setup %.4f wait %.4f deliver %.4f' % (t['alloc'], t['staging_setup_thread_secs'], t['staging_wait_thread_secs'], t['deliver_thread_secs']), flush=True)
PY
    done
  done
done
echo "== end $(date +%T)"
