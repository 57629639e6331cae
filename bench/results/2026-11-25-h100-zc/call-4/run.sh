#!/bin/bash
# exp23.sh OUTDIR: a fresh process's first load with every thread's kernel state sampled (firstprobe.py *sample).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs" "$O/tl"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
which gdb perf eu-stack py-spy bpftrace strace ltrace 2>&1 | head; uname -r; cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
for i in 1 2 3; do
  for arm in defaultsample preparesample; do
    PYTHONPATH=$site timeout 60 python3 $B/firstprobe.py $f1 $arm $O/probe-1GiB.jsonl $O/tl/1g-$arm-$i.log 2>> $O/logs/probe.err
  done
done
tail -3 $O/logs/probe.err
echo "== end $(date +%T)"
