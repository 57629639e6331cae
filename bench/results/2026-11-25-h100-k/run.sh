#!/bin/bash
# exp4.sh OUTDIR: the GPU tests at this commit, then the restart case at 4 GiB with cache_pages huge and base
# (bench/shapes.py --cases restart,warm, weightlift load_file), now that the populate mapping's page-table entries
# are dropped right after populating.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 300 bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 8 $O/logs/check.log
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
echo "== make $(date +%T)"
timeout 90 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log; echo "make rc=$?"
for mode in huge base; do
  echo "== $mode $(date +%T)"
  t=$(date +%H%M%S)
  WEIGHTLIFT_CACHE_PAGES=$mode timeout 70 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases restart,warm --runs 3 \
     --methods weightlift.load_file --out $O/shapes-$mode-$t.json > /dev/null 2> $O/logs/shapes-$mode-$t.log
  echo "rc=$?"; grep FileHugePages /proc/meminfo
  grep -h "best" $O/logs/shapes-$mode-$t.log
done
echo "== end $(date +%T)"
