#!/bin/bash
# run.sh OUTDIR: how the way a file entered the page cache changes a fresh process's warm load of it.
B=$(cd "$(dirname "$0")" && pwd); O=$1; mkdir -p "$O/loads"
S=/root/wl-scratch; mkdir -p $S; F=$S/rf-4g.bin
W=$B/bin/weightlift
uname -r > $O/host.txt; findmnt -T $S >> $O/host.txt; for q in /sys/block/*/queue; do echo "$q $(cat $q/read_ahead_kb) $(cat $q/max_sectors_kb)" >> $O/host.txt; done
grep -E "MemTotal|MemAvailable" /proc/meminfo >> $O/host.txt; cat /sys/kernel/mm/transparent_hugepage/enabled >> $O/host.txt
[ -f $F ] || head -c 4294967296 /dev/urandom > $F
cat > /tmp/rd.py <<'P'
import os,time,threading,sys
F=sys.argv[1]; n=os.path.getsize(F); T=int(sys.argv[2]); CH=4<<20
def worker(i,buf):
    fd=os.open(F,os.O_RDONLY); off=i*CH
    while off<n:
        os.preadv(fd,[buf],off); off+=T*CH
    os.close(fd)
bufs=[bytearray(CH) for _ in range(T)]
out=[]
for rep in range(3):
    th=[threading.Thread(target=worker,args=(i,bufs[i])) for i in range(T)]
    t=time.perf_counter(); [x.start() for x in th]; [x.join() for x in th]; out.append(round(n/(time.perf_counter()-t)/1e9,2))
print(T,"threads GB/s",out)
P
for round in 1 2; do
for m in dd wl wl1 wlcpu cat; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  t0=$(date +%s.%N)
  case $m in
    dd) dd if=$F of=/dev/null bs=16M 2>/dev/null ;;
    cat) cat $F > /dev/null ;;
    wl) $W load --raw u8 --device cuda:0 --no-ceiling --json $F > $O/loads/pop-$m-$round.json ;;
    wl1) WEIGHTLIFT_THREADS=1 $W load --raw u8 --device cuda:0 --no-ceiling --json $F > $O/loads/pop-$m-$round.json ;;
    wlcpu) $W load --raw u8 --device cpu --json $F > $O/loads/pop-$m-$round.json ;;
  esac
  t1=$(date +%s.%N)
  echo "== $m round $round populate $(echo "$t1 - $t0" | bc) s; $(grep -E 'FileHugePages' /proc/meminfo | tr -s ' ')"
  for i in 1 2 3; do $W load --raw u8 --device cuda:0 --no-ceiling --json $F > $O/loads/$m-$round-$i.json; done
  python3 -c "
import json,sys
for i in (1,2,3):
    d=json.load(open('$O/loads/$m-$round-%d.json'%i)); t=d.get('times') or d.get('io',{}).get('times',{})
    print('  fresh process', d.get('seconds'), d.get('gbps'), {k:round(v,4) for k,v in t.items()})
" 2>&1 | head -5
  python3 /tmp/rd.py $F 16
done
done
echo "== end $(date +%T)"
