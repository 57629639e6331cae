#!/bin/bash
# exp24.sh OUTDIR: the GPU tests (gpu-check tests); a fresh process's first load step by step (firstprobe.py,
# default arm, with kernel stacks sampled); bench/shapes.py warm, restart and first-load for weightlift.load_file
# on a 1.25 GB upstream file, first-load on a 4.49 GB one.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs" "$O/tl"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 8 $O/logs/check-tests.log
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
echo "== probe $(date +%T)"
for i in 1 2 3; do
  for arm in default defaultsample; do
    PYTHONPATH=$site timeout 60 python3 $B/firstprobe.py $f1 $arm $O/probe-1GiB.jsonl $O/tl/1g-$arm-$i.log 2>> $O/logs/probe.err
  done
done
echo "== shapes $(date +%T)"
PYTHONPATH=$site timeout 200 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,restart,first-load --runs 5 \
  --methods weightlift.load_file --out $O/shapes-1GiB.json > $O/logs/shapes-1GiB.out 2> $O/logs/shapes-1GiB.log; echo "shapes rc=$?"
PYTHONPATH=$site timeout 100 python3 $B/bench/shapes.py --file $f4 --device cuda:0 --cases first-load --runs 5 \
  --methods weightlift.load_file --out $O/shapes-4GiB.json > $O/logs/shapes-4GiB.out 2> $O/logs/shapes-4GiB.log; echo "shapes rc=$?"
python3 - $O <<'PY'
import json, sys
for f in ("shapes-1GiB.json", "shapes-4GiB.json"):
    try:
        d = json.load(open(f"{sys.argv[1]}/{f}"))
    except Exception as e:
        print(f, e); continue
    for r in d["results"]:
        print(f, r["case"], "best", r.get("best"), "median", r.get("median"), "runs_s", r.get("runs_s"),
              "ratio", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"), r.get("verified"))
PY
echo "== end $(date +%T)"
