#!/bin/bash
# exp3.sh OUTDIR: gpu-check's bench part, then the first load of a fresh Python process under several settings.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
wl=$B/bin/weightlift; S=/root/wl-scratch; mkdir -p $S; export WEIGHTLIFT_CACHE=$S/cache
echo "== bench $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check bench
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
echo "== first loads $(date +%T)"
f=$S/upstream-4GiB.safetensors
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
for v in "" "WEIGHTLIFT_STAGING_PAGES=base" "WEIGHTLIFT_THREADS=8" "WEIGHTLIFT_CHUNK_BYTES=2MiB"; do
  n=${v:-defaults}; n=${n//=/-}
  env $v timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load --runs 3 --methods weightlift.load_file --out $O/first-load-$n.json > /dev/null 2> $O/logs/first-load-$n.log
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));r=[x for x in d['results'] if x['case'].startswith('first-load')][0];rf=r.get('report_first') or {};print(sys.argv[2],r['median_first_to_second_time_ratio'],r['first_to_second_time_ratio'],r['runs_s'],{k:round(v,3) for k,v in (rf.get('times') or {}).items()})" $O/first-load-$n.json $n 2>&1 | cut -c1-400
done
echo "== end $(date +%T)"
