#!/bin/bash
# run.sh OUTDIR: gpu-check tests at this bundle's commit; then what a fresh process's first load and a restart pay
# for at 4 GiB: one CLI load with the lanes' staging set-up logged, and bench/shapes.py's warm, first-load and restart
# cases for weightlift under the default 4 MiB chunks and under 2 MiB chunks (half the staging to set up).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; df -h /root /dev/shm; } > $O/logs/machine.txt 2>&1
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 280 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 16 $O/logs/check-tests.log; grep -E "FAILED|ERROR|panicked" $O/check/logs/*.log | head -20
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site PYTHONUNBUFFERED=1
f=$S/upstream-4GiB.safetensors
python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --make-only --device cuda:0 > /dev/null 2> $O/logs/make.log
echo "make rc=$?"
cat $f > /dev/null
RUST_LOG=weightlift_io=debug,weightlift=debug timeout 60 $B/bin/weightlift load $f --device cuda:0 > $O/logs/cli-load.txt 2> $O/logs/cli-load-debug.log
echo "cli rc=$?"; tail -n 6 $O/logs/cli-load.txt; grep -c "staging set up" $O/logs/cli-load-debug.log
for v in 4MiB 2MiB; do
  echo "== chunk_bytes $v $(date +%T)"
  WEIGHTLIFT_CHUNK_BYTES=$v timeout 125 python3 $B/bench/shapes.py --file $f --device cuda:0 \
    --cases warm,first-load,restart --methods "weightlift.load_file" --time-limit 110 \
    --out $O/shapes-chunk-$v.json > /dev/null 2> $O/logs/shapes-chunk-$v.log
  echo "shapes rc=$?"
  grep -E "best|goal|skip|stopped" $O/logs/shapes-chunk-$v.log | grep -v "not measured" | tail -n 12
done
echo "== end $(date +%T)"
