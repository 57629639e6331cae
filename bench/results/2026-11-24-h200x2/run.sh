#!/bin/bash
# run.sh OUTDIR: on the GPUs of one host: the current-context tests (Rust, Python on two GPUs), then
# weightlift.distributed (NCCL) with bench/distributed_bench.py (4 GiB file and a sharded save_pretrained
# checkpoint, warm and cold, fastsafetensors with its process group).
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch/dist; mkdir -p $S
nvidia-smi -L > $O/logs/gpus.txt 2>&1; nvidia-smi topo -m >> $O/logs/gpus.txt 2>&1; head -3 $O/logs/gpus.txt
n=$(nvidia-smi -L | wc -l)
site=$(mktemp -d); python3 -m pip install --quiet --no-index --no-deps --target "$site" "$B"/wheels/*.whl "$B"/peer-wheels/*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
echo "== context tests $(date +%T)"
timeout 60 $B/bin/gpu-tests --test-threads=1 the_callers_current_context > $O/logs/ctx-rust.log 2>&1; echo "rust rc=$?"; grep "test result" $O/logs/ctx-rust.log
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 120 python3 -m pytest $B/tests/test_python_api.py -k "current_device" -v -p no:cacheprovider > $O/logs/ctx-python.log 2>&1; echo "python rc=$?"; tail -n 2 $O/logs/ctx-python.log
echo "== full $(date +%T)"
timeout 420 torchrun --standalone --nproc_per_node $n $B/bench/distributed_bench.py $O --scratch $S --gib 4 --runs 3 > $O/logs/full.log 2>&1
echo "full rc=$?"; grep -v "^W1" $O/logs/full.log | tail -n 24
echo "== end $(date +%T)"
