#!/bin/bash
# run.sh OUTDIR: warm and tmpfs loads of the 1.25 GB upstream file with 16 lanes (the default on 16 CPUs) and with
# 32 (WEIGHTLIFT_THREADS=32), alternating, two rounds, beside KvikIO; and the host's own read rate of the page
# cache and of tmpfs with 8, 16, 32 and 64 threads.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl $B/peer-wheels/*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cp $f1 /dev/shm/wl-upstream.safetensors
PYTHONPATH=$site:$B/bench timeout 120 python3 - $f1 /dev/shm/wl-upstream.safetensors > $O/read-rates.json 2> $O/logs/read-rates.log <<'PY'
import json, sys
import shapes
out = {}
for name, path in (("page_cache", sys.argv[1]), ("tmpfs", sys.argv[2])):
    for t in (8, 16, 32, 64):
        r = shapes.parallel_read_rate(path, t, 5)
        out[f"{name}_read{t}"] = r
        print(name, t, r["best"], r["median"], file=sys.stderr, flush=True)
print(json.dumps(out))
PY
cat $O/logs/read-rates.log
for i in 1 2; do
  for lanes in 16 32; do
    WEIGHTLIFT_THREADS=$lanes PYTHONPATH=$site timeout 100 python3 $B/bench/shapes.py --file $f1 --shm-file /dev/shm/wl-upstream.safetensors \
      --device cuda:0 --cases warm,tmpfs --runs 5 --methods "weightlift.load_file,kvikio" --out $O/lanes$lanes-$i.json > /dev/null 2> $O/logs/lanes$lanes-$i.log
    echo "lanes $lanes round $i rc=$?"; grep -E "best|goal met|goal NOT" $O/logs/lanes$lanes-$i.log | sed -n '1,8p'
  done
done
rm -f /dev/shm/wl-upstream.safetensors
