#!/bin/bash
# exp5.sh OUTDIR: the GPU tests, then a fresh engine's lanes staged in one shared region (the default) against one
# region per lane (WEIGHTLIFT_SHARED_STAGING=0): fresh Python processes' first loads, and fresh engines in the bench.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S; wl=$B/bin/weightlift
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 320 bash $B/scripts/gpu-check $O/check tests > $O/logs/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|tests_rc" $O/logs/tests.log | tail -n 6
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site WEIGHTLIFT_CACHE=$S/cache
f=$S/upstream-4GiB.safetensors
echo "== first loads $(date +%T)"
[ -f $f ] || timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 150 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 4 --variants none,env:WEIGHTLIFT_SHARED_STAGING=0,warmup 2>&1 | tee $O/logs/first-load-alloc.log
echo "== engine first loads $(date +%T)"
for i in 1 2 3; do for v in 1 0; do
  WEIGHTLIFT_SHARED_STAGING=$v timeout 40 $wl bench --device cuda:0 --cases warm --runs 3 --no-cold --out $O/w-$v-$i.json > $O/logs/w-$v-$i.log 2>&1
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));e=d.get('engine_setup',{});t=e.get('first_times',{});print('shared',sys.argv[2],round(e.get('ratio'),3),round(e.get('first_secs'),4),round(e.get('second_secs'),4),'alloc',round(t.get('alloc'),4),'setup',round(t.get('staging_setup_thread_secs'),4),'wait',round(t.get('staging_wait_thread_secs'),4),'deliver',round(t.get('deliver_thread_secs'),4),[(c['name'],round(c['ratio'],3)) for c in d.get('cases',[])])" $O/w-$v-$i.json $v-$i 2>&1 | cut -c1-300
done; done
echo "== end $(date +%T)"
