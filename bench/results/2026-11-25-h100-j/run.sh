#!/bin/bash
# exp3.sh OUTDIR: the full bench (its warm case follows its cold case), then the restart case at 4 GiB with
# cache_pages base and huge alternating (bench/shapes.py --cases restart,warm, weightlift load_file), on another
# machine than the eighth run's.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== bench $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 280 bash $B/scripts/gpu-check $O/bench bench > $O/logs/bench.log 2>&1
echo "bench rc=$?"; grep -B2 -A14 "^case" $O/logs/bench.log | cut -c1-150
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
timeout 90 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log; echo "make rc=$?"
for mode in huge base huge base; do
  echo "== $mode $(date +%T)"
  t=$(date +%H%M%S)
  WEIGHTLIFT_CACHE_PAGES=$mode timeout 60 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases restart,warm --runs 3 \
     --methods weightlift.load_file --out $O/shapes-$mode-$t.json > /dev/null 2> $O/logs/shapes-$mode-$t.log
  echo "rc=$?"; grep FileHugePages /proc/meminfo
  grep -h "best" $O/logs/shapes-$mode-$t.log
done
echo "== end $(date +%T)"
