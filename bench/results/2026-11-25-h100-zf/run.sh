#!/bin/bash
# exp26.sh OUTDIR: 8 lanes against 16 (the default here): `weightlift bench --cases warm,tmpfs` (4 GiB synthetic,
# ceiling ratios), alternating twice; bench/shapes.py first-load on a 4.49 GB upstream file and warm on a 1.25 GB
# one, each setting once.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
summ() { python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(sys.argv[2], r["case"][:10], "best", r.get("best"), "median", r.get("median"), "runs_s", r.get("runs_s"),
          "f/s", r.get("median_first_to_second_time_ratio"), r.get("first_to_second_time_ratio"), "verified", r.get("verified"), flush=True)
PY
}
echo "== bench $(date +%T)"
for i in 1 2; do
  for t in 8 16; do
    PYTHONUNBUFFERED=1 timeout 120 $B/bin/weightlift bench --device cuda:0 --cases warm,tmpfs --runs 5 --no-cold --dir $S \
      --threads $t --out $O/bench-t$t-$i.json > $O/logs/bench-t$t-$i.log 2>&1; echo "bench t$t-$i rc=$?"
    grep -E "first load of the engine|pinned host|llama, (warm|tmpfs) " $O/logs/bench-t$t-$i.log | sed 's/first_times.*//' | tail -n 4
  done
done
f1=$S/upstream-1GiB.safetensors; f4=$S/upstream-4GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f4 --size 4GiB --make-only > /dev/null 2> $O/logs/make4.log; echo "make rc=$?"
cat $f1 > /dev/null; cat $f4 > /dev/null
echo "== shapes $(date +%T)"
for t in 8 16; do
  WEIGHTLIFT_THREADS=$t PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f4 --device cuda:0 --cases first-load --runs 4 \
    --methods weightlift.load_file --out $O/first4-t$t.json > /dev/null 2> $O/logs/first4-t$t.log
  summ $O/first4-t$t.json first4-t$t
  WEIGHTLIFT_THREADS=$t PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --file $f1 --device cuda:0 --cases warm --runs 5 \
    --methods weightlift.load_file --out $O/warm1-t$t.json > /dev/null 2> $O/logs/warm1-t$t.log
  summ $O/warm1-t$t.json warm1-t$t
done
echo "== end $(date +%T)"
