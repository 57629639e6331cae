#!/bin/bash
# run.sh OUTDIR: gpu-check tests at HEAD; then cold loads of a 1.25 GB upstream file under several settings
# (queue depth, chunk size, cache policy) beside fastsafetensors, alternating, and the disk's parallel
# O_DIRECT dd rate at 16 and 64 streams.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 14 $O/logs/check-tests.log; grep -E "FAILED|ERROR" $O/check/logs/python-tests.log | head -20
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl $B/peer-wheels/*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
summ() { python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(sys.argv[2], r["method"][:28], "best", r.get("best"), "median", r.get("median"), "runs_s", r.get("runs_s"), "verified", r.get("verified"), flush=True)
for s in d.get("skipped", []): print(sys.argv[2], "skip", s)
PY
}
echo "== cold sweep $(date +%T)"
for i in 1 2; do
  for arm in default qd4 bypass bypass-qd4 chunk8 fst; do
    m=weightlift.load_file
    case $arm in
      default) env=();; qd2) env=(WEIGHTLIFT_QUEUE_DEPTH=2);; qd4) env=(WEIGHTLIFT_QUEUE_DEPTH=4);;
      chunk8) env=(WEIGHTLIFT_CHUNK_BYTES=8MiB);; bypass) env=(WEIGHTLIFT_PAGE_CACHE=bypass);;
      bypass-qd4) env=(WEIGHTLIFT_PAGE_CACHE=bypass WEIGHTLIFT_QUEUE_DEPTH=4);; threads32) env=(WEIGHTLIFT_THREADS=32);;
      fst) env=(); m=fastsafetensors;;
    esac
    env "${env[@]}" PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases cold --runs 3 \
      --methods $m --out $O/cold-$arm-$i.json > /dev/null 2> $O/logs/cold-$arm-$i.log
    summ $O/cold-$arm-$i.json $arm-$i
  done
done
echo "== dd $(date +%T)"
sz=$(stat -c %s $f1)
for n in 16 64; do
  for r in 1 2; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    stripe=$(( (sz / n / 16777216) + 1 ))
    t0=$(date +%s.%N)
    for k in $(seq 0 $((n-1))); do dd if=$f1 of=/dev/null bs=16M iflag=direct skip=$((k*stripe)) count=$stripe 2>/dev/null & done; wait
    t1=$(date +%s.%N)
    python3 -c "print('dd streams $n run $r GB/s', round($sz/($t1-$t0)/1e9, 3))"
  done
done
echo "== end $(date +%T)"
