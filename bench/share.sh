#!/usr/bin/env bash
# bench/run share: shared blocks through a real mount (fs/FORMAT.md "Shared blocks").
#   1. `cp` of a 1 GiB file (coreutils >= 9 copies with copy_file_range, which warpfs answers
#      with a clone) against a byte copy of the same file (dd, read and write), in one run:
#      seconds and the space each takes (df's used blocks before and after), with the ratio.
#   2. the dedup pass (-o dedup) over a tree of many files with duplicate contents: the space
#      it gave back and the time it took (the daemon's live view, warpfs-stat --json).
# One JSON object per line on stdout. Root, FUSE, fio not needed.
#
#   usage: bench/share.sh BUILD_DIR [--size-mb N] [--files N] [--distinct N] [--file-kb N]
set -euo pipefail

build=${1:?usage: share.sh BUILD_DIR [--size-mb N] [--files N] [--distinct N] [--file-kb N]}
shift
size_mb=1024 files=2000 distinct=50 file_kb=256
while (($#)); do
  case $1 in
    --size-mb) size_mb=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --distinct) distinct=$2; shift 2 ;;
    --file-kb) file_kb=$2; shift 2 ;;
    --quick) size_mb=256 files=400 distinct=20; shift ;;
    *) echo "share.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
warpfs=$build/fs/daemon/warpfs
mkfs=$build/mkfs/mkfs.warpfs
stat_bin=$build/fs/daemon/warpfs-stat
for b in "$warpfs" "$mkfs" "$stat_bin"; do
  [[ -x $b ]] || { echo "share.sh: $b missing (build it first)" >&2; exit 2; }
done
tmp=${TMPDIR:-/dev/shm}
work=$(mktemp -d "$tmp/share-bench.XXXXXX")
mnt=$work/mnt
img=$work/img
mkdir -p "$mnt"
pid=""
cleanup() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  [[ -n $pid ]] && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mount_it() {  # OPTIONS
  "$warpfs" -f -o "$1" "emu:$img" "$mnt" 2>>"$work/daemon.log" &
  pid=$!
  for _ in $(seq 200); do mountpoint -q "$mnt" && return; sleep 0.05; done
  cat "$work/daemon.log" >&2
  exit 1
}
unmount_it() {
  fusermount3 -u "$mnt"
  wait "$pid"
  pid=""
}
used() { df -B1 --output=used "$mnt" | tail -1 | tr -d ' '; }
now() { date +%s.%N; }

# --- 1. cp (clone) against a byte copy -------------------------------------------------------
"$mkfs" -q --size "$((size_mb * 3 + 512))M" "emu:$img"
mount_it cache_mb=256
head -c "$((size_mb << 20))" /dev/urandom >"$mnt/big"
sync -f "$mnt/big"
u0=$(used)
t0=$(now)
cp "$mnt/big" "$mnt/clone"
sync -f "$mnt/clone"
t1=$(now)
u1=$(used)
dd if="$mnt/big" of="$mnt/copy" bs=1M status=none
sync -f "$mnt/copy"
t2=$(now)
u2=$(used)
cmp "$mnt/big" "$mnt/clone" && cmp "$mnt/big" "$mnt/copy" || { echo "share.sh: copies differ" >&2; exit 1; }
"$stat_bin" --json "$mnt" >"$work/stats1.json"
unmount_it
python3 - "$size_mb" "$t0" "$t1" "$t2" "$u0" "$u1" "$u2" "$work/stats1.json" <<'EOF'
import json, sys
mb, t0, t1, t2 = int(sys.argv[1]), *map(float, sys.argv[2:5])
u0, u1, u2 = map(int, sys.argv[5:8])
st = json.load(open(sys.argv[8])).get("shared", {})
clone = {"bench": "share", "case": "cp_clone", "bytes": mb << 20, "seconds": round(t1 - t0, 4),
         "space_bytes": u1 - u0, "shared_blocks": st.get("shared_blocks")}
copy = {"bench": "share", "case": "dd_copy", "bytes": mb << 20, "seconds": round(t2 - t1, 4),
        "space_bytes": u2 - u1}
print(json.dumps(clone))
print(json.dumps(copy))
print(json.dumps({"bench": "share", "case": "cp_clone_vs_dd_copy",
                  "time_ratio": round((t1 - t0) / (t2 - t1), 5),
                  "space_ratio": round((u1 - u0) / max(1, u2 - u1), 5)}))
EOF

# --- 2. the dedup pass over many duplicate files --------------------------------------------
rm -f "$img"
"$mkfs" -q --size 2048M "emu:$img"
mount_it cache_mb=256
mkdir -p "$mnt/tree"
for ((k = 0; k < distinct; ++k)); do head -c "$((file_kb << 10))" /dev/urandom >"$work/src$k"; done
for ((i = 0; i < files; ++i)); do
  mkdir -p "$mnt/tree/d$((i % 20))"
  dd if="$work/src$((i % distinct))" of="$mnt/tree/d$((i % 20))/f$i" bs=1M status=none
done
sync -f "$mnt/tree"
u0=$(used)  # before the remount: the pass starts with the mount
unmount_it
mount_it cache_mb=256,dedup
state=""
for _ in $(seq 6000); do
  "$stat_bin" --json "$mnt" >"$work/stats2.json"
  state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("dedup",{}).get("state",""))' "$work/stats2.json")
  [[ $state == running || $state == off || -z $state ]] || break
  sleep 0.1
done
sync -f "$mnt/tree"
u1=$(used)
unmount_it
python3 - "$files" "$distinct" "$file_kb" "$u0" "$u1" "$work/stats2.json" "$state" <<'EOF'
import json, sys
files, distinct, kb, u0, u1 = map(int, sys.argv[1:6])
d = json.load(open(sys.argv[6])).get("dedup", {})
expect = (files - distinct) * kb * 1024
print(json.dumps({"bench": "share", "case": "dedup_pass", "files": files, "distinct": distinct,
                  "file_kb": kb, "state": sys.argv[7], "seconds": d.get("seconds"),
                  "blocks_hashed": d.get("blocks_hashed"), "blocks_shared": d.get("blocks_shared"),
                  "space_freed_bytes": u0 - u1, "duplicate_bytes": expect,
                  "freed_ratio": round((u0 - u1) / expect, 4) if expect else None}))
EOF
