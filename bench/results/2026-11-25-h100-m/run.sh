#!/bin/bash
# exp6.sh OUTDIR: a fresh process's first load, staging set up fully one lane at a time (old/, commit 3e15bcd)
# against faulted in at once and pinned one at a time (this bundle), alternating; the set-up's parts from the
# CLI's debug lines; then the GPU tests at this commit.
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
RUST_LOG=weightlift_io=debug timeout 30 $B/bin/weightlift load --device cuda:0 --no-ceiling $f1 > $O/cli-new.txt 2>&1; echo "rc=$?"
grep -c "staging set up" $O/cli-new.txt; grep "staging set up" $O/cli-new.txt | head -3; grep -v "staging set up" $O/cli-new.txt | tail -8
for i in 1 2 3; do
  for f in $f1 $f4; do
    for w in old new; do
      site=$old; [ $w = new ] && site=$new
      n=$(basename $f .safetensors)
      PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 \
        --methods weightlift.load_file --out $O/first-$w-$n-$i.json > /dev/null 2> $O/logs/first-$w-$n-$i.log
      python3 - $O/first-$w-$n-$i.json $w $n <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['results']:
    if r['case'].startswith('first'):
        t=r['report_first']['times']
        print(sys.argv[2], sys.argv[3], 'first s', r['runs_s'], 'ratio', r['first_to_second_time_ratio'], 'alloc %.4f setup %.4f wait %.4f deliver %.4f' % (t['alloc'], t['staging_setup_thread_secs'], t['staging_wait_thread_secs'], t['deliver_thread_secs']))
PY
    done
  done
done
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 320 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check.log
echo "== end $(date +%T)"
