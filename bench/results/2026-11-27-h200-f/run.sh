#!/bin/bash
# run.sh OUTDIR: bench/first_pin_probe.py (what a fresh process's first cuMemHostRegister costs, and after what it is
# cheap), then bench/shapes.py's sharded case at 4 GiB (a checkpoint written by transformers' save_pretrained in
# 1 GB shards; weightlift's load_file against safetensors', cold and warm). Logs go into OUTDIR/logs.tgz.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; } > $L/machine.txt 2>&1
echo "== first pin $(date +%T)"
timeout 120 python3 $B/bench/first_pin_probe.py $O/first-pin.json --runs 3 > $L/first-pin.log 2>&1
echo "probe rc=$?"; sed -n '/^{$/,$p' $L/first-pin.log
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $L/install.log 2>&1
echo "== sharded $(date +%T)"
PYTHONPATH=$site PYTHONUNBUFFERED=1 timeout 400 python3 $B/bench/shapes.py --make-upstream $S/upstream-4GiB.safetensors \
  --size 4GiB --device cuda:0 --cases sharded --methods "weightlift.load_file,safetensors.load_file" \
  --time-limit 330 --out $O/shapes-sharded.json > /dev/null 2> $L/shapes.log
echo "shapes rc=$?"
grep -E "best|ceiling|skip|stopped|==" $L/shapes.log | tail -n 20
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
