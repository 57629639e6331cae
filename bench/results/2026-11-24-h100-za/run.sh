#!/bin/bash
# exp.sh OUTDIR: staging page sizes (first load, warm) and packed-load read-ahead, fresh processes.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
wl=$B/bin/weightlift; S=/root/wl-scratch; mkdir -p $S; export WEIGHTLIFT_CACHE=$S/cache
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
nvidia-smi > $O/logs/nvidia-smi.txt 2>&1
{ cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; uname -r; nproc; free -g; } > $O/logs/host.txt
grep -E "compact_stall|compact_success|thp_fault" /proc/vmstat > $O/logs/vmstat-0.txt
echo "== A $(date +%T)"
for i in 1 2 3; do for v in huge base; do
  WEIGHTLIFT_STAGING_PAGES=$v timeout 90 $wl bench --device cuda:0 --cases warm --runs 3 --no-cold --out $O/w-$v-$i.json > $O/logs/w-$v-$i.log 2>&1
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));e=d.get('engine_setup',{});print(sys.argv[2],e.get('ratio'),e.get('first_secs'),e.get('second_secs'),e.get('first_times',{}).get('staging_setup_thread_secs'),[(c['name'],round(c['ratio'],3)) for c in d.get('cases',[])])" $O/w-$v-$i.json $v-$i 2>&1 | cut -c1-300
done; done
grep -E "compact_stall|compact_success|thp_fault" /proc/vmstat > $O/logs/vmstat-1.txt
echo "== B $(date +%T)"
WEIGHTLIFT_BIN=$wl timeout 220 python3 $B/bench/pack_settings.py $O --dir $S --variant "" --variant "WEIGHTLIFT_PREFETCH_BYTES=1GiB" --variant "WEIGHTLIFT_PREFETCH_BYTES=512MiB" --variant "WEIGHTLIFT_STAGING_PAGES=base" > $O/logs/pack-settings.log 2>&1
tail -n 8 $O/logs/pack-settings.log
echo "== C $(date +%T)"
python3 - $S > $O/pack-open.json 2> $O/logs/pack-open.log <<'PY'
import glob, json, sys, time
from weightlift import _native
res = {}
for f in sorted(glob.glob(sys.argv[1] + "/**/*.wlpack", recursive=True)):
    ts = []
    for _ in range(40):
        t = time.perf_counter(); c = _native.Checkpoint([f]); ts.append(time.perf_counter() - t); del c
    ts.sort(); res[f] = {"min_ms": ts[0] * 1e3, "median_ms": ts[20] * 1e3, "max_ms": ts[-1] * 1e3}
print(json.dumps(res, indent=1))
PY
cat $O/pack-open.json
echo "== D $(date +%T)"
timeout 200 python3 $B/bench/shapes.py --make-upstream $S/upstream-4GiB.safetensors --size 4GiB --device cuda:0 --cases warm,first-load,restart --methods weightlift.load_file --weightlift-bin $wl --out $O/shapes.json > /dev/null 2> $O/logs/shapes.log
grep -E "best|skip" $O/logs/shapes.log | tail -n 12
echo "== end $(date +%T)"
