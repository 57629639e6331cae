#!/bin/bash
# exp27.sh OUTDIR: the GPU tests (gpu-check tests); bench/shapes.py warm, restart and first-load for
# weightlift.load_file on a 1.25 GB upstream file.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check-tests.log
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
echo "== shapes $(date +%T)"
PYTHONPATH=$site timeout 200 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,restart,first-load --runs 5 \
  --methods weightlift.load_file --out $O/shapes-1GiB.json > $O/logs/shapes-1GiB.out 2> $O/logs/shapes-1GiB.log; echo "shapes rc=$?"
python3 - $O/shapes-1GiB.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(r["case"][:12], "best", r.get("best"), "median", r.get("median"), "runs_s", r.get("runs_s"),
          "f/s", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"), "verified", r.get("verified"))
PY
echo "== end $(date +%T)"
