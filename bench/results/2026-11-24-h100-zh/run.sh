#!/bin/bash
# exp1.sh OUTDIR: one pool growth per load (the default) against block-by-block growth
# (WEIGHTLIFT_POOL_RESERVE=0): fresh Python processes' first loads, restarts, engine first loads, warm rate.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
wl=$B/bin/weightlift; S=/root/wl-scratch; mkdir -p $S; export WEIGHTLIFT_CACHE=$S/cache
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
nvidia-smi > $O/logs/nvidia-smi.txt 2>&1
f=$S/upstream-4GiB.safetensors
echo "== A first loads $(date +%T)"
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 200 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 5 --variants none,env:WEIGHTLIFT_POOL_RESERVE=0 2>&1 | tee $O/logs/first-load-alloc.log
echo "== B engine first loads + warm $(date +%T)"
for i in 1 2 3; do for v in 1 0; do
  WEIGHTLIFT_POOL_RESERVE=$v timeout 90 $wl bench --device cuda:0 --cases warm --runs 3 --no-cold --out $O/w-$v-$i.json > $O/logs/w-$v-$i.log 2>&1
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));e=d.get('engine_setup',{});print('reserve',sys.argv[2],e.get('ratio'),e.get('first_secs'),e.get('second_secs'),e.get('first_times',{}).get('alloc'),[(c['name'],round(c['ratio'],3)) for c in d.get('cases',[])])" $O/w-$v-$i.json $v-$i 2>&1 | cut -c1-300
done; done
echo "== C restart $(date +%T)"
for v in 1 0; do
  WEIGHTLIFT_POOL_RESERVE=$v timeout 150 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases first-load,restart --runs 3 --methods weightlift.load_file --weightlift-bin $wl --out $O/shapes-$v.json > /dev/null 2> $O/logs/shapes-$v.log
  python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
for r in d['results']:
    print('reserve',sys.argv[2],r['case'],{k:v for k,v in r.items() if 'ratio' in k or k in ('best_gbps','median_gbps')})" $O/shapes-$v.json $v 2>&1 | cut -c1-400
done
echo "== end $(date +%T)"
