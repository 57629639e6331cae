#!/bin/bash
# run.sh OUTDIR: bench/shapes.py on a 4 GiB upstream file (the size of DESIGN.md's and issue 11's measurements), with
# the best peers of earlier runs (KvikIO, fastsafetensors, safetensors; np.fromfile for host loads): ceilings, then
# warm, tmpfs, first-load, restart, cold and host cases, and the goals judged by this run alone. The run stops
# measuring after 480 s and still writes its JSON (--time-limit).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; df -h /root /dev/shm; } > $O/logs/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl $B/peer-wheels/*.whl > $O/logs/install.log 2>&1
echo "install rc=$?"
f=$S/upstream-4GiB.safetensors
echo "== shapes $(date +%T)"
PYTHONPATH=$site PYTHONUNBUFFERED=1 timeout 540 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --device cuda:0 \
  --cases warm,tmpfs,first-load,restart,cold,host --methods "weightlift.,kvikio,fastsafetensors,safetensors.load_file" \
  --weightlift-bin $B/bin/weightlift --time-limit 480 --out $O/shapes.json > /dev/null 2> $O/logs/shapes.log
echo "shapes rc=$?"
grep -E "best|ceiling|goal|skip|stopped|==" $O/logs/shapes.log | tail -n 60
echo "== end $(date +%T)"
