#!/bin/bash
# run.sh OUTDIR: every goal of issue 11 in one run of bench/shapes.py on a 4 GiB file written by
# safetensors.torch.save_file, with the default read-ahead window (8 GiB): ceilings, then warm, tmpfs, first-load, restart,
# cold, CLI and host cases; peers KvikIO, fastsafetensors, safetensors (load_file and safe_open), the Run:ai
# model streamer and InstantTensor, np.fromfile for host loads. The run stops measuring after 515 s and still
# writes its JSON (--time-limit). Logs go into OUTDIR/logs.tgz.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O"
L=$(mktemp -d); S=/root/wl-scratch; mkdir -p $S
{ nvidia-smi; uname -r; nproc; free -g; df -h /root /dev/shm; } > $L/machine.txt 2>&1
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl $B/peer-wheels/*.whl > $L/install.log 2>&1
echo "install rc=$?"
f=$S/upstream-4GiB.safetensors
echo "== shapes $(date +%T)"
PYTHONPATH=$site PYTHONUNBUFFERED=1 timeout 575 python3 $B/bench/shapes.py --make-upstream $f --size 4GiB --device cuda:0 \
  --cases warm,tmpfs,first-load,restart,cold,cli,host \
  --methods "weightlift,kvikio,fastsafetensors,safetensors.,runai,instanttensor" \
  --weightlift-bin $B/bin/weightlift --time-limit 515 --out $O/shapes.json > /dev/null 2> $L/shapes.log
echo "shapes rc=$?"
grep -E "best|ceiling|goal|skip|stopped|==" $L/shapes.log | tail -n 70
tar czf $O/logs.tgz -C $L .
echo "== end $(date +%T)"
