#!/bin/bash
# exp5.sh OUTDIR: the GPU tests at this commit, and one cold CLI load of a 4 GiB upstream file onto cuda:0 (its
# report's cold-range line and JSON fields), then a new process's load of the same file.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 320 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check.log
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site WEIGHTLIFT_CACHE=$S/cache
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
timeout 90 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log; echo "make rc=$?"
sync; echo 3 > /proc/sys/vm/drop_caches
echo "== cold CLI load $(date +%T)"
timeout 60 $B/bin/weightlift load --device cuda:0 --no-ceiling $f 2>&1 | tee $O/cold-load.txt
grep FileHugePages /proc/meminfo | tee -a $O/cold-load.txt
echo "== next process $(date +%T)"
timeout 60 $B/bin/weightlift load --device cuda:0 --no-ceiling --json $f > $O/next-load.json; echo "rc=$?"
python3 -c "import json;d=json.load(open('$O/next-load.json'));print('next process: %.2f GB/s, %.3f s; populated %d' % (d['gbps'], d['seconds'], d['populated_bytes']))"
echo "== end $(date +%T)"
