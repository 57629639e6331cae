#!/bin/bash
# exp3.sh OUTDIR: the full bench (warm after cold, with the sampled page-cache probe), then fresh processes' first
# loads, restarts and warm loads of a 4 GiB upstream file.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== bench $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/bench bench > $O/logs/bench.log 2>&1
grep -A12 "^case" $O/logs/bench.log
python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
for c in d['cases']:
    t=c['detail'].get('times') or {}; print(c['name'][:30], round(c['ratio'],3) if c.get('ratio') else None, 'plan', t.get('plan'), 'io', t.get('io'), 'secs', c['detail'].get('seconds'))" $O/bench/bench.json
wl=$B/bin/weightlift; export WEIGHTLIFT_CACHE=$S/cache
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== shapes $(date +%T)"
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 200 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases warm,first-load,restart --runs 3 --methods weightlift.load_file --weightlift-bin $wl --out $O/shapes.json > /dev/null 2> $O/logs/shapes.log
python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
for r in d['results']:
    rep=r.get('report') or {}
    print(r['case'], r['runs_gbps'], r.get('first_to_second_time_ratio'), r.get('resident_after_first_process'), (rep.get('times') or {}).get('plan'), (rep.get('times') or {}).get('alloc'))" $O/shapes.json
echo "== end $(date +%T)"
