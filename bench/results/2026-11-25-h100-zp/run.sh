#!/bin/bash
# exp35.sh OUTDIR: gpu-check tests at this bundle's commit (the load server's GPU tests among them); then the
# 1.25 GB upstream file's warm, restart and first-load cases (bench/shapes.py) for weightlift.load_file without and
# with a load server (python -m weightlift serve, started by shapes.py for each family).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 14 $O/logs/check-tests.log; grep -E "test_server|FAILED|Error" $O/check/logs/python-tests.log | head -20
echo "== shapes $(date +%T)"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 240 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm,first-load,restart --runs 5 \
  --methods weightlift.load_file --out $O/shapes-server.json > $O/logs/shapes.out 2> $O/logs/shapes.log; echo "shapes rc=$?"
python3 - $O/shapes-server.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    rep = r.get("report") or {}
    srv = rep.get("server") or {}
    print(r["method"], "|", r["case"][:12], "best", r.get("best"), "median", r.get("median"), "runs_s", [round(x, 4) for x in r.get("runs_s") or []],
          "f/s", r.get("first_to_second_time_ratio"), r.get("median_first_to_second_time_ratio"), "verified", r.get("verified"),
          "backend", rep.get("backend"), "server_used", srv.get("used"), srv.get("reason"), flush=True)
for s in d.get("skipped", []):
    print("skipped", s)
PY
tail -n 5 $O/logs/shapes.log
echo "== end $(date +%T)"
