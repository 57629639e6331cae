#!/bin/bash
# exp34.sh OUTDIR: gpu-check tests at this bundle's commit; then helperprobe.py: a fresh process's first and second
# load of the 1.25 GB upstream file, by its own engine (own) or by a resident helper process that reads into the
# client's device memory through CUDA IPC (helper), alternating, six processes each.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 330 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 25 $O/logs/check-tests.log
echo "== probe $(date +%T)"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
f1=$S/upstream-1GiB.safetensors
PYTHONPATH=$site timeout 60 python3 $B/bench/shapes.py --make-upstream $f1 --size 1GiB --make-only > /dev/null 2> $O/logs/make1.log; echo "make rc=$?"
cat $f1 > /dev/null
sock=$S/helper.sock; rm -f $sock $S/ready
PYTHONPATH=$site python3 $B/helperprobe.py helper $sock $S/ready > $O/logs/helper.log 2>&1 &
hp=$!
for i in $(seq 100); do [ -f $S/ready ] && break; sleep 0.2; done
echo "helper ready after $i polls"
for i in 1 2 3 4 5 6; do
  for arm in own helper; do
    PYTHONPATH=$site timeout 60 python3 $B/helperprobe.py client $f1 $sock $arm $O/helperprobe.jsonl 2>> $O/logs/client.err
  done
done
kill $hp
tail -n 20 $O/logs/client.err $O/logs/helper.log
echo "== end $(date +%T)"
