#!/bin/bash
# exp4.sh OUTDIR: a fresh Python process's first load, with and without touching device memory first.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
f=$S/upstream-4GiB.safetensors
timeout 120 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only > /dev/null 2> $O/logs/make.log
timeout 400 python3 $B/bench/first_load_alloc.py $f $O/first-load-alloc.json --runs 3 --variants none,pool:2MiB,pool:64MiB,pool:1GiB,pool 2>&1 | tee $O/logs/first-load-alloc.log
