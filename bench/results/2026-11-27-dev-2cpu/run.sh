#!/bin/bash
# run.sh OUTDIR: the host case of bench/shapes.py on the 2-core development VM (no GPU): weightlift's load_file into
# fresh host memory against np.fromfile, interleaved pairs, on a 1 GiB file written by safetensors.torch.save_file.
# Run from the repository with the Python environment of scripts/python-env active (weightlift installed in it).
O=${1:?usage: run.sh OUTDIR}; mkdir -p "$O"
R=$(cd "$(dirname "$0")/../../.." && pwd)
f=${WEIGHTLIFT_CACHE:-$HOME/.cache/weightlift}/upstream-1GiB.safetensors
python3 $R/bench/shapes.py --make-upstream $f --size 1GiB --device cpu --cases host --runs 7 \
  --out $O/shapes-host.json > /dev/null 2> $O/shapes-host.log
echo "shapes rc=$?"
grep -E "best|goal" $O/shapes-host.log | grep -v "not measured"
