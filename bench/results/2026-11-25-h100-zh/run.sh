#!/bin/bash
# exp28.sh OUTDIR: a fresh process's first load with the lanes' pinning held back while torch's blocks are
# allocated (WEIGHTLIFT_EXP_GATE=1, an uncommitted experiment) against without, alternating: 1.25 GB three
# rounds, 4.49 GB one round (bench/shapes.py first-load, 4 processes per invocation).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
summ() { python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    rep = r.get("report_first") or {}
    print(sys.argv[2], "runs_s", r.get("runs_s"), "f/s", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"),
          "alloc", (rep.get("times") or {}).get("alloc"), "verified", r.get("verified"), flush=True)
PY
}
run() { # name file env...
  local n=$1 f=$2; shift 2
  env "$@" PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 4 \
    --methods weightlift.load_file --out $O/first-$n.json > /dev/null 2> $O/logs/first-$n.log
  summ $O/first-$n.json $n
}
echo "== first-load $(date +%T)"
for i in 1 2 3; do
  run gate-1g-$i $f1 WEIGHTLIFT_EXP_GATE=1
  run none-1g-$i $f1 WEIGHTLIFT_EXP_NONE=1
done
run gate-4g $f4 WEIGHTLIFT_EXP_GATE=1
run none-4g $f4 WEIGHTLIFT_EXP_NONE=1
echo "== end $(date +%T)"
