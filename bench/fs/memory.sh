#!/usr/bin/env bash
# bench/fs/memory.sh: the warpfs daemon's resident memory with many files (bench/run memory).
#
#   memory.sh --build DIR --out STEM [--files N] [--dirs D] [--quick]
#
# For each configuration (the defaults: software cache 64 MiB, metadata cache capped at
# 32 MiB; no software cache; no metadata cap), in one run:
#   a fresh image in /dev/shm, mounted; N files created in D directories and then stat'ed
#   (the kernel holds every inode); the daemon's RSS at mount, its peak (sampled every 50 ms
#   while the files are made), its RSS with everything looked up; then
#   `echo 2 > /proc/sys/vm/drop_caches` (the kernel forgets every inode: FORGETs) and, once
#   the daemon's node table is down to the root (its stats, up to 120 s), the settled RSS.
# One JSON object per line (KiB), then ratio lines against the defaults. As root.
# RSS here is the daemon's own: VmRSS less RssShmem, the pages of the image (on /dev/shm)
# that its emulated device maps to read and write them, which are the image's, not the
# daemon's.
set -euo pipefail

build= out= files=1000000 dirs=1000
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --dirs) dirs=$2; shift 2 ;;
    --quick) files=100000; dirs=100; shift ;;
    -h|--help) sed -n 2,16p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "memory.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $build && -n $out ]] || { echo "memory.sh: --build and --out are required" >&2; exit 2; }
warpfs=$build/fs/daemon/warpfs
mkfs=$build/mkfs/mkfs.warpfs
work=$(mktemp -d /dev/shm/warpfs-memory.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() { fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

own_kib() { awk '$1 == "VmRSS:" { r = $2 } $1 == "RssShmem:" { s = $2 } END { print r - s }' "/proc/$1/status"; }
stat_field() {  # the daemon's stats JSON, one fs field
  kill -USR1 "$1"
  for _ in $(seq 1 50); do
    [[ -s $work/stats.json ]] && break
    sleep 0.1
  done
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fs'][sys.argv[2]])" "$work/stats.json" "$2"
}

measure() {  # NAME OPTIONS
  local name=$1 opts=$2
  rm -f "$work/img" "$work/stats.json"
  "$mkfs" -q --size 16G --inodes $((files + files / 4 + 1000)) "emu:$work/img" >/dev/null
  "$warpfs" "emu:$work/img" "$mnt" -o "stats=$work/stats.json${opts:+,$opts}"
  local pid
  pid=$(pgrep -n -f "warpfs emu:$work/img") || { echo "memory.sh: no daemon" >&2; exit 1; }
  local at_mount t0 t1
  at_mount=$(own_kib "$pid")
  rm -f "$work/loaded"
  (
    top=0
    while [[ ! -e $work/loaded ]] && v=$(own_kib "$pid" 2>/dev/null) && [[ -n $v ]]; do
      ((v > top)) && top=$v && echo "$top" >"$work/peak"
      sleep 0.05
    done
  ) &
  local sampler=$!
  t0=$(date +%s.%N)
  python3 - "$mnt" "$files" "$dirs" <<'EOF'
import os, sys
mnt, files, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per = files // dirs
for d in range(dirs):
    p = f"{mnt}/d{d}"
    os.mkdir(p)
    for f in range(per):
        os.close(os.open(f"{p}/f{f}", os.O_CREAT | os.O_WRONLY, 0o644))
for d in range(dirs):
    for f in range(per):
        os.lstat(f"{mnt}/d{d}/f{f}")
EOF
  t1=$(date +%s.%N)
  local loaded peak nodes_loaded buffers_loaded
  loaded=$(own_kib "$pid")
  touch "$work/loaded"
  wait "$sampler" || true
  peak=$(cat "$work/peak" 2>/dev/null || echo 0)
  ((loaded > peak)) && peak=$loaded
  rm -f "$work/stats.json"
  nodes_loaded=$(stat_field "$pid" nodes)
  rm -f "$work/stats.json"
  buffers_loaded=$(stat_field "$pid" meta_buffers)
  sync
  echo 2 >/proc/sys/vm/drop_caches
  local nodes=$nodes_loaded
  for _ in $(seq 1 240); do
    rm -f "$work/stats.json"
    nodes=$(stat_field "$pid" nodes)
    [[ $nodes -le 2 ]] && break
    sleep 0.5
  done
  sleep 6  # one timed commit (5 s) with its eviction pass after the last FORGET
  local settled buffers
  settled=$(own_kib "$pid")
  rm -f "$work/stats.json"
  buffers=$(stat_field "$pid" meta_buffers)
  fusermount3 -u "$mnt"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  printf '{"bench":"memory","fs":"%s","options":"%s","files":%d,"create_stat_s":%.1f,"rss_mount_kib":%d,"rss_peak_kib":%d,"rss_loaded_kib":%d,"nodes_loaded":%d,"meta_buffers_loaded":%d,"rss_settled_kib":%d,"nodes_settled":%d,"meta_buffers_settled":%d}\n' \
    "$name" "$opts" "$files" "$(awk -v a="$t0" -v b="$t1" "BEGIN { print b - a }")" "$at_mount" "$peak" "$loaded" \
    "$nodes_loaded" "$buffers_loaded" "$settled" "$nodes" "$buffers" | tee -a "$out.jsonl"
}

: >"$out.jsonl"
measure warpfs ""
measure warpfs_nocache "cache_mb=0"
measure warpfs_nocap "meta_cache_mb=0"
python3 - "$out.jsonl" <<'EOF' | tee -a "$out.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"rss_peak_kib"' in l]
base = rows[0]
for r in rows[1:]:
    for k in ("rss_peak_kib", "rss_loaded_kib", "rss_settled_kib"):
        print(json.dumps({"bench": "memory", "ratio": f"{r['fs']}/{base['fs']}", "metric": k,
                          "value": round(r[k] / base[k], 3)}))
for r in rows:
    print(json.dumps({"bench": "memory", "fs": r["fs"], "metric": "settled_above_mount_mib",
                      "value": round((r["rss_settled_kib"] - r["rss_mount_kib"]) / 1024, 1)}))
EOF
