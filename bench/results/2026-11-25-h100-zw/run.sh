#!/bin/bash
# run.sh OUTDIR: probe.py: fresh processes loading a 1.25 GB upstream file, three loads each, through a load server
# and by themselves (alternating, five of each), with the engine's DEBUG records and reports.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 90 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
# probe.py is beside this script in this folder.
PYTHONPATH=$site timeout 400 python3 $B/probe.py $f1 $O 2> $O/logs/probe.log; echo "probe rc=$?"; tail -5 $O/logs/probe.log
