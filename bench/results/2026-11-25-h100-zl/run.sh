#!/bin/bash
# exp32.sh OUTDIR: a fresh process's first load (bench/shapes.py first-load, 1.25 GB upstream file) with the wheel of
# this bundle and the wheel of 50b8502 (old-wheel/), alternating, three rounds of four processes; firstprobe.py
# timelines (new wheel); warm and restart (new wheel); then the GPU tests (gpu-check tests).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs" "$O/tl"
S=/root/wl-scratch; mkdir -p $S
new=$(mktemp -d); old=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $new $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --target $old $B/old-wheel/weightlift-*.whl >> $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$new timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
summ() { python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(sys.argv[2], r["case"][:10], "best", r.get("best"), "median", r.get("median"), "runs_s", [round(x, 4) for x in r.get("runs_s") or []],
          "f/s", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"), "verified", r.get("verified"), flush=True)
PY
}
echo "== first-load 1.25 GB $(date +%T)"
for i in 1 2 3; do
  for arm in new old; do
    site=$new; [ $arm = old ] && site=$old
    PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases first-load --runs 4 \
      --methods weightlift.load_file --out $O/first-$arm-$i.json > /dev/null 2> $O/logs/first-$arm-$i.log
    summ $O/first-$arm-$i.json $arm-$i
  done
done
echo "== probe $(date +%T)"
for i in 1 2 3; do
  PYTHONPATH=$new timeout 60 python3 $B/firstprobe.py $f1 default $O/probe-1GiB.jsonl $O/tl/1g-default-$i.log 2>> $O/logs/probe.err
done
echo "== warm, restart $(date +%T)"
PYTHONPATH=$new timeout 200 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,restart --runs 5 \
  --methods weightlift.load_file --out $O/shapes-1GiB.json > $O/logs/shapes-1GiB.out 2> $O/logs/shapes-1GiB.log; echo "shapes rc=$?"
summ $O/shapes-1GiB.json new
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check-tests.log
echo "== end $(date +%T)"
