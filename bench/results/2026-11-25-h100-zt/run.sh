#!/bin/bash
# exp38.sh OUTDIR: the load server's tests and the Ctrl-C tests on the GPU (tests/test_server.py,
# tests/test_robustness.py -k ctrl_c), with this bundle's wheel.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target $site $B/wheels/weightlift-*.whl > $O/logs/install.log 2>&1
echo "== tests $(date +%T) commit $(cat $B/COMMIT)"
PYTHONPATH=$site WEIGHTLIFT_BIN=$B/bin/weightlift timeout 400 python3 -m pytest $B/tests/test_server.py $B/tests/test_robustness.py -k "server or ctrl_c" -v -ra -p no:cacheprovider > $O/logs/pytest.log 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" $O/logs/pytest.log | tail -n 20
echo "== end $(date +%T)"
