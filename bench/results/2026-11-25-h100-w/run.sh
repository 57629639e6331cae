#!/bin/bash
# exp16.sh OUTDIR: where torch-allocated blocks go (diag.py on a 24 MiB generated file), the two tests that failed in
# the previous run alone, then the whole Python test file on cuda:0.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
export PYTHONPATH=$site
$B/bin/weightlift generate $S/llama24.safetensors --layout llama --size 24MiB --seed 5 > /dev/null
echo "== diag"; timeout 60 python3 $B/diag.py $S/llama24.safetensors 2>&1 | tail -40
cd $B
echo "== two tests"; WEIGHTLIFT_BIN=$B/bin/weightlift timeout 120 python3 -m pytest -q -x tests/test_python_api.py -k "torchs_allocator or failing_device_allocator or freeing_gpu" -p no:cacheprovider 2>&1 | tail -30
WEIGHTLIFT_BIN=$B/bin/weightlift timeout 120 python3 -m pytest -q tests/test_robustness.py -k "ctrl_c" -p no:cacheprovider 2>&1 | tail -15
echo "== file"; WEIGHTLIFT_BIN=$B/bin/weightlift timeout 200 python3 -m pytest -q tests/test_python_api.py -p no:cacheprovider 2>&1 | tail -30
