#!/bin/bash
# run.sh OUTDIR: bench/fresh_memory_probe.py (the CUDA driver alone): host->device copies of 4 GiB into fresh
# device memory, from cuMemAlloc and from the trimmed stream-ordered pool, first and second fill, against a buffer
# written before; five rounds, twice in two processes.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
{ nvidia-smi; uname -r; nproc; free -g; } > $O/machine.txt 2>&1
for i in 1 2; do
  echo "== process $i $(date +%T)"
  timeout 120 python3 $B/bench/fresh_memory_probe.py $O/fresh-memory-$i.json --gib 4 --rounds 5 2>&1 | tail -n 9
  echo "rc=${PIPESTATUS[0]}"
done
echo "== end $(date +%T)"
