#!/bin/bash
# exp2.sh OUTDIR: staging set-up as one region against one lane after another (driver alone, fresh processes);
# lanes setting up at once (WEIGHTLIFT_STAGING_SETUP=parallel) against one at a time in weightlift's first loads.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs" "$O/probe"
wl=$B/bin/weightlift; S=/root/wl-scratch; mkdir -p $S; export WEIGHTLIFT_CACHE=$S/cache
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
nvidia-smi > $O/logs/nvidia-smi.txt 2>&1
echo "== A staging probe $(date +%T)"
for i in 1 2 3; do for c in 16x8MiB_hugepage_serial 1x128MiB_hugepage 16x8MiB_hugepage_serial_with_alloc_4GiB 1x128MiB_hugepage_with_alloc_4GiB alloc_4GiB_alone; do
  timeout 60 python3 $B/bench/driver_probe.py $O/probe/$c-$i.json --staging-only --case $c 2>&1 | grep staging | cut -c1-250
done; done
f=$S/upstream-4GiB.safetensors
echo "== B first loads $(date +%T)"
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 200 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 4 --variants none,env:WEIGHTLIFT_STAGING_SETUP=parallel 2>&1 | tee $O/logs/first-load-alloc.log
echo "== C engine first loads + warm $(date +%T)"
for i in 1 2 3; do for v in serial parallel; do
  WEIGHTLIFT_STAGING_SETUP=$v timeout 90 $wl bench --device cuda:0 --cases warm --runs 3 --no-cold --out $O/w-$v-$i.json > $O/logs/w-$v-$i.log 2>&1
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));e=d.get('engine_setup',{});t=e.get('first_times',{});print(sys.argv[2],round(e.get('ratio'),3),round(e.get('first_secs'),4),round(e.get('second_secs'),4),'alloc',round(t.get('alloc'),4),'setup',round(t.get('staging_setup_thread_secs'),4),'wait',round(t.get('staging_wait_thread_secs'),4),'deliver',round(t.get('deliver_thread_secs'),4),[(c['name'],round(c['ratio'],3)) for c in d.get('cases',[])])" $O/w-$v-$i.json $v-$i 2>&1 | cut -c1-300
done; done
echo "== end $(date +%T)"
