#!/bin/bash
# exp6.sh OUTDIR: the GPU tests, then a fresh Python process's first load (nothing touched first, or the pool).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
echo "== first loads $(date +%T)"
f=$S/upstream-4GiB.safetensors
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 200 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 4 --variants none,pool:2MiB 2>&1 | tee $O/logs/first-load-alloc.log
timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 --methods weightlift.load_file --out $O/first-load.json > /dev/null 2> $O/logs/first-load.log
python3 -c "import json,sys;d=json.load(open(sys.argv[1]));r=[x for x in d['results'] if x['case'].startswith('first-load')][0];print('shapes first-load', r['median_first_to_second_time_ratio'], r['first_to_second_time_ratio'], (r.get('report_first') or {}).get('gpu',{}).get('open_secs'))" $O/first-load.json
echo "== end $(date +%T)"
