#!/bin/bash
# exp1.sh OUTDIR: cache_pages base against huge: a cold load, what it leaves in the page cache, and the next
# process's load (bench/shapes.py cold, warm and restart cases, weightlift load_file only, 4 GiB upstream file),
# alternating, with the disk ceiling (8 x dd O_DIRECT) before and after; then the GPU tests.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d); python3 -m pip install --quiet --no-index --no-deps --target "$site" "$B"/wheels/weightlift-*.whl
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
dd_ceiling() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  local sz=$(stat -c %s $f) n=8 t0 t1; local per=$(( sz / n / 16777216 ))
  t0=$(date +%s%N)
  for i in $(seq 0 $((n-1))); do dd if=$f of=/dev/null bs=16M iflag=direct skip=$((i*per)) count=$per status=none & done; wait
  t1=$(date +%s%N)
  python3 -c "print('dd ceiling %.3f GB/s' % ($n*$per*16777216/(($t1-$t0)/1e9)/1e9))"
}
echo "== make $(date +%T)"
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --device cuda:0 --cases warm --runs 1 --methods weightlift.load_file --out $O/make.json > /dev/null 2> $O/logs/make.log; echo "make rc=$?"
dd_ceiling | tee $O/dd-1.txt
for mode in base huge base huge; do
  echo "== $mode $(date +%T)"
  WEIGHTLIFT_CACHE_PAGES=$mode timeout 120 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases cold,restart,warm --runs 3 \
     --methods weightlift.load_file,file-order --out $O/shapes-$mode-$(date +%H%M%S).json > /dev/null 2> $O/logs/shapes-$mode-$(date +%H%M%S).log
  echo "rc=$?"; grep FileHugePages /proc/meminfo
done
dd_ceiling | tee $O/dd-2.txt
python3 - $O <<'PY'
import json, glob, sys, os
for p in sorted(glob.glob(sys.argv[1] + "/shapes-*.json")):
    d = json.load(open(p))
    for r in d.get("results", []):
        extra = {k: r.get(k) for k in ("first_process_cold_gbps", "resident_after_first_process") if k in r}
        rep = r.get("report") or {}
        print(os.path.basename(p), r["case"], "best %.2f median %.2f" % (r["best"], r["median"]), [round(x, 2) for x in r["runs_gbps"]], extra,
              {k: rep.get(k) for k in ("cache_pages", "populated_bytes", "populate_refusal") if k in rep})
PY
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout $(( 585 - SECONDS - 10 )) bash $B/scripts/gpu-check $O/check tests > $O/logs/check.log 2>&1
echo "tests rc=$?"; tail -n 30 $O/logs/check.log
echo "== end $(date +%T)"
