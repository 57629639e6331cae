#!/bin/bash
# exp30.sh OUTDIR: the GPU tests (gpu-check tests), then pinprobe.py (how pinning scales with size) in fresh processes.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/logs"
S=/root/wl-scratch; mkdir -p $S
echo "== pinprobe $(date +%T)"
for r in 1 2 3; do
  for m in sizes unfaulted hostalloc contend-none contend-16x8 contend-1x128; do
    timeout 60 python3 $B/pinprobe.py $m >> $O/pinprobe.jsonl 2>> $O/logs/pinprobe.err
  done
done
python3 - $O/pinprobe.jsonl <<'PY'
import json,sys,statistics as st
rows=[json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    m=r["mode"]
    if m=="sizes":
        by={}
        for x in r["rows"]: by.setdefault(x["mib"],[]).append(x["reg_s"]*1e3)
        print("sizes first8=%.2fms"%(r["first_reg_8MiB_s"]*1e3), {k:round(st.median(v),3) for k,v in sorted(by.items())},
              "16x8=%.2f 1x128=%.2f 16slices=%.2f"%(r["16x8_total_s"]*1e3,r["1x128_s"]*1e3,r["16slices_total_s"]*1e3))
    elif m.startswith("contend"):
        print(m, "pin=%.2fms copies=%d p50=%.3f max=%.3f sum=%.2f"%(r["pin_total_s"]*1e3,r["copies_during"],r["issue_ms_p50"] or 0,r["issue_ms_max"] or 0,r["issue_ms_sum"]))
    else:
        print(m, [(x["mib"], round((x.get("reg_s") or x.get("alloc_s"))*1e3,3)) for x in r["rows"]])
PY
echo "== tests $(date +%T)"
WEIGHTLIFT_GPU_CHECK_SCRATCH=$S timeout 400 bash $B/scripts/gpu-check $O/check tests > $O/logs/check-tests.log 2>&1
echo "tests rc=$?"; tail -n 6 $O/logs/check-tests.log
echo "== end $(date +%T)"
