#!/usr/bin/env bash
# The daemon's CPU and context switches by thread name (FUSE workers, read reapers, the
# emulated controller's threads) during 2 x QD32 4 KiB O_DIRECT random reads of a 256 MiB
# file (bench/fs/aioload.c), on a fresh 1 GiB emulated image:
#   thread_cpu.sh LAT_US [OPTS]    OPTS: more -o options for warpfs, commas
# WARPFS, MKFS: the binaries (default: warpfs, mkfs.warpfs on PATH); AIOLOAD: the load
# generator (default TMPDIR/aioload, built from aioload.c where absent); SECONDS_PER_JOB
# (default 5); TMPDIR (default /dev/shm). Prints one JSON object per thread name:
# {"lat","opts","iops","thread","cpu_s","ctx_per_op"}: CPU seconds over the job (user and
# system, from /proc/PID/task/*/stat) and context switches per read.
set -u
(($# >= 1)) || { sed -n 2,10p "$0" >&2; exit 2; }
lat=$1 opts=${2:-}
tmp=${TMPDIR:-/dev/shm} secs=${SECONDS_PER_JOB:-5}
warpfs=${WARPFS:-warpfs} mkfs=${MKFS:-mkfs.warpfs}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
aioload=${AIOLOAD:-$tmp/aioload}
[[ -x $aioload ]] || cc -O2 -pthread -o "$aioload" "$here/aioload.c" || exit 1
mnt=$(mktemp -d "$tmp/thread-cpu-mnt.XXXXXX") img=$(mktemp "$tmp/thread-cpu.XXXXXX.img")
pid=""
cleanup() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  [[ -n $pid ]] && wait "$pid" 2>/dev/null
  rm -rf "$mnt" "$img" "$img".t0 "$img".t1 "$img".log
}
trap cleanup EXIT
rm -f "$img"
"$mkfs" -q --size 1024M "emu:$img" || exit 1
"$warpfs" -f -o "latency_us=$lat${opts:+,$opts}" "emu:$img" "$mnt" 2>"$img.log" &
pid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
mountpoint -q "$mnt" || { cat "$img.log" >&2; exit 1; }
dd if=/dev/zero of="$mnt/f" bs=1M count=256 oflag=direct status=none || exit 1
# name (digits dropped: nvme-emu-0..N are one) ticks switches, summed by name
snap() {
  local t s
  for t in /proc/"$pid"/task/*; do
    read -r -a s <<<"$(sed 's/.*) //' "$t/stat")"
    echo "$(tr -d '0-9' <"$t/comm") $((s[11] + s[12])) $(awk '/ctxt_switches/{n+=$2} END{print n}' "$t/status")"
  done | awk '{a[$1]+=$2; b[$1]+=$3} END{for(k in a) print k, a[k], b[k]}' | sort
}
snap >"$img.t0"
out=$("$aioload" "$mnt/f" read 256 32 2 "$secs") || exit 1
snap >"$img.t1"
iops=$(sed -E 's/.*"iops":([0-9]+).*/\1/' <<<"$out")
hz=$(getconf CLK_TCK)
join "$img.t0" "$img.t1" | awk -v lat="$lat" -v o="$opts" -v iops="$iops" -v secs="$secs" -v hz="$hz" \
  '{printf "{\"lat\":%s,\"opts\":\"%s\",\"iops\":%s,\"thread\":\"%s\",\"cpu_s\":%.2f,\"ctx_per_op\":%.3f}\n",
    lat, o, iops, $1, ($4 - $2) / hz, ($5 - $3) / (iops * secs)}'
