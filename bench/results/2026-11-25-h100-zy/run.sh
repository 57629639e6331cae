#!/bin/bash
# run.sh OUTDIR: gpu-check tests; then bench/shapes.py on the 1.25 GB upstream file, cold, warm, tmpfs and host
# cases for weightlift's load_file, KvikIO and fastsafetensors: the ceilings (the disk's now also by buffered
# readers after dropping the caches, tmpfs by 16 threads) and the goals they judge.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 14 $O/logs/check-tests.log; grep -E "test_server|FAILED|ERROR" $O/check/logs/python-tests.log | head -20
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl $B/peer-wheels/*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
echo "== shapes $(date +%T)"
PYTHONPATH=$site PYTHONUNBUFFERED=1 timeout 200 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --device cuda:0 \
  --cases cold,warm,tmpfs,host --methods "weightlift.load_file,kvikio,fastsafetensors,np.fromfile" \
  --out $O/shapes.json > /dev/null 2> $O/logs/shapes.log; echo "shapes rc=$?"
grep -E "best|ceiling|goal|skip" $O/logs/shapes.log | tail -n 30
echo "== end $(date +%T)"
