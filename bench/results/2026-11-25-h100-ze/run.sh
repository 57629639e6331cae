#!/bin/bash
# exp25.sh OUTDIR: a fresh process's first load (bench/shapes.py first-load, 1.25 GB upstream file) with the
# default settings and three others, alternating (chunk_bytes 2 MiB, threads 8, staging_pages base); warm loads
# with the default and chunk_bytes 2 MiB; then `weightlift bench --cases warm,tmpfs` (ceiling ratios, 4 GiB).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
summ() { python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(sys.argv[2], r["case"][:10], "best", r.get("best"), "median", r.get("median"), "runs_s", r.get("runs_s"),
          "f/s", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"), "verified", r.get("verified"), flush=True)
PY
}
echo "== first-load $(date +%T)"
for i in 1 2; do
  for arm in default chunk2 threads8 base; do
    case $arm in
      default) env=();; chunk2) env=(WEIGHTLIFT_CHUNK_BYTES=2MiB);; threads8) env=(WEIGHTLIFT_THREADS=8);; base) env=(WEIGHTLIFT_STAGING_PAGES=base);;
    esac
    env "${env[@]}" PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases first-load --runs 4 \
      --methods weightlift.load_file --out $O/first-$arm-$i.json > /dev/null 2> $O/logs/first-$arm-$i.log
    summ $O/first-$arm-$i.json $arm-$i
  done
done
echo "== warm $(date +%T)"
for i in 1 2; do
  for arm in default chunk2; do
    case $arm in default) env=();; chunk2) env=(WEIGHTLIFT_CHUNK_BYTES=2MiB);; esac
    env "${env[@]}" PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm --runs 5 \
      --methods weightlift.load_file --out $O/warm-$arm-$i.json > /dev/null 2> $O/logs/warm-$arm-$i.log
    summ $O/warm-$arm-$i.json $arm-$i
  done
done
echo "== bench $(date +%T)"
PYTHONUNBUFFERED=1 timeout 240 $B/bin/weightlift bench --device cuda:0 --cases warm,tmpfs --runs 5 --no-cold --dir $S \
  --out $O/bench.json > $O/logs/bench.log 2>&1; echo "bench rc=$?"; tail -n 25 $O/logs/bench.log
echo "== end $(date +%T)"
