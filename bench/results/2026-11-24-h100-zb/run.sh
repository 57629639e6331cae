#!/bin/bash
# exp2.sh OUTDIR: the GPU tests, then staging page sizes on warm loads (fresh processes, interleaved), then packed
# loads with the defaults, a device cache and base staging pages (and the steps of opening the pack).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
wl=$B/bin/weightlift; S=/root/wl-scratch; mkdir -p $S; export WEIGHTLIFT_CACHE=$S/cache
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
echo "== A $(date +%T)"
for i in 1 2 3; do for v in base huge; do
  WEIGHTLIFT_STAGING_PAGES=$v timeout 60 $wl bench --device cuda:0 --cases warm --runs 5 --no-cold --out $O/w-$v-$i.json > $O/logs/w-$v-$i.log 2>&1
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));e=d.get('engine_setup',{});c=d['cases'][0];print(sys.argv[2],round(e.get('ratio'),3),round(c['ratio'],3),[round(x/c['ceiling_gbps'],3) for x in c['runs_gbps']])" $O/w-$v-$i.json $v-$i 2>&1 | cut -c1-300
done; done
echo "== B $(date +%T)"
WEIGHTLIFT_BIN=$wl timeout 200 python3 $B/bench/pack_settings.py $O --dir $S --variant "" --variant "WEIGHTLIFT_DEVICE_CACHE_BYTES=8GiB" --variant "WEIGHTLIFT_STAGING_PAGES=base" > $O/logs/pack-settings.log 2>&1
tail -n 10 $O/logs/pack-settings.log
echo "== end $(date +%T)"
