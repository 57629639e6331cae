#!/bin/bash
# run.sh OUTDIR: the engine's GPU tests of streaming loads short of device memory and out of memory, and the 1,000
# mixed loads (200 of them streams taken in random order), from the gpu test executable of this folder.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
nvidia-smi > $O/nvidia-smi.txt 2>&1
$B/gpu-tests --test-threads=1 --nocapture a_stream_short_of_device_memory_reads_ahead_less \
  out_of_memory_mid_load_is_a_clean_error > $O/gpu-tests.log 2>&1
echo "short-of-memory tests rc=$?"
WEIGHTLIFT_BENCH_OUT=$O $B/gpu-tests --ignored --nocapture a_thousand_mixed_loads_keep_memory_flat >> $O/gpu-tests.log 2>&1
echo "thousand rc=$?"
grep -E "^test |test result|taken and dropped|kept|panicked" $O/gpu-tests.log
