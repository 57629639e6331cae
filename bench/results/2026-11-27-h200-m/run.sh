#!/bin/bash
# run.sh OUTDIR: the engine's GPU tests, and the 1,000 mixed loads, from the `gpu` test executable of this folder
# (release, stripped), after the tests' byte comparison became one helper.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
nvidia-smi > $O/nvidia-smi.txt 2>&1
$B/gpu-tests --test-threads=1 --nocapture > $O/gpu-tests.log 2>&1
echo "gpu tests rc=$?"
WEIGHTLIFT_BENCH_OUT=$O $B/gpu-tests --ignored --nocapture a_thousand_mixed_loads_keep_memory_flat >> $O/gpu-tests.log 2>&1
echo "thousand rc=$?"
grep -E "^test |test result|panicked" $O/gpu-tests.log | grep -v "injected panic"
