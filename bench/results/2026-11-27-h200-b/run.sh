#!/bin/bash
# run.sh OUTDIR: weightlift's load_file and safe_open (file and random key order) on a 4 GiB upstream file, warm,
# tmpfs and cold, under two read-ahead windows in one run: the default prefetch_bytes (2 GiB, under the file's size)
# and 8 GiB (over it). Each run of bench/shapes.py measures its own ceilings and stops measuring after 150 s.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $O/logs/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
echo "install rc=$?"
f=$S/upstream-4GiB.safetensors
export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $O/logs/make.log
echo "make rc=$?"
for pf in 2GiB 8GiB; do
  echo "== prefetch_bytes $pf $(date +%T)"
  WEIGHTLIFT_PREFETCH_BYTES=$pf timeout 170 python3 $B/bench/shapes.py --file $f --device cuda:0 --cases warm,tmpfs,cold \
    --methods "weightlift." --time-limit 150 --out $O/shapes-prefetch-$pf.json > /dev/null 2> $O/logs/shapes-prefetch-$pf.log
  echo "shapes rc=$?"
  grep -E "best|goal|skip|stopped" $O/logs/shapes-prefetch-$pf.log | grep -v "pinned copy ceiling\|disk ceiling" | tail -n 14
done
echo "== end $(date +%T)"
