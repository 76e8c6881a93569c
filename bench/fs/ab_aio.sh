#!/usr/bin/env bash
# Side-by-side 4 KiB O_DIRECT random reads and writes (bench/fs/aioload.c: native AIO, no fio)
# on several FUSE daemons, rounds alternating the daemons: for a machine where fio and
# libfuse's examples cannot be installed, such as the 16-core device machine.
#   usage: ab_aio.sh ROUNDS NAME=[VAR=VALUE,...@]KIND[:OPTS] ...
#   KIND: warpfs (a fresh image, -o latency_us=$LAT_US, default 0), null (warpfs-null),
#         pll (passthrough_ll over a directory in TMPDIR); OPTS: more -o options, commas;
#         VAR=VALUE: the daemon's environment, but BIN=PATH: the daemon's binary instead of
#         the kind's own (an older build beside the new one, say), and LAT_US=N: this
#         variant's emulated latency (warpfs), where the environment's LAT_US sets every one's.
# WARPFS, MKFS, NULL, PLL: the binaries (default: on PATH as warpfs, mkfs.warpfs, warpfs-null,
# passthrough_ll); AIOLOAD: the load generator (default TMPDIR/aioload; built from aioload.c
# beside this script where absent, the default also when older than aioload.c); JOBS:
# "rw:qd:jobs" list (default "read:32:1 write:32:1 read:8:4 write:8:4 read:1:1");
# SECONDS_PER_JOB (default 3); TMPDIR (default /dev/shm).
# Prints one JSON object per measurement: {"variant","round","rw","qd","jobs","iops"}.
set -u
(($# >= 2)) || { sed -n 2,16p "$0" >&2; exit 2; }
rounds=$1
shift
tmp=${TMPDIR:-/dev/shm}
warpfs=${WARPFS:-warpfs} mkfs=${MKFS:-mkfs.warpfs} null=${NULL:-warpfs-null}
pll=${PLL:-passthrough_ll}
jobs=${JOBS:-read:32:1 write:32:1 read:8:4 write:8:4 read:1:1}
secs=${SECONDS_PER_JOB:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
aioload=${AIOLOAD:-$tmp/aioload}
# Built where it is absent; the default one in TMPDIR also when aioload.c is newer than the
# binary a previous run left there.
if [[ ! -x $aioload || (-z ${AIOLOAD:-} && $here/aioload.c -nt $aioload) ]]; then
  cc -O2 -pthread -o "$aioload" "$here/aioload.c" || exit 1
fi
mnt=$(mktemp -d "$tmp/ab-aio-mnt.XXXXXX")
src=$(mktemp -d "$tmp/ab-aio-src.XXXXXX")
pid=""
cleanup() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt" 2>/dev/null
  mountpoint -q "$mnt" && umount "$mnt"
  [[ -n $pid ]] && wait "$pid" 2>/dev/null
  rm -rf "$mnt" "$src" "$tmp"/ab-aio-*.img
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mount_variant() {  # KIND OPTS ENV
  local kind=$1 opts=$2 o env=(env) list v bin="" lat=${LAT_US:-0}
  IFS=, read -r -a list <<<"$3"
  for v in "${list[@]}"; do
    case $v in
      BIN=*) bin=${v#BIN=} ;;
      LAT_US=*) lat=${v#LAT_US=} ;;  # the script's setting, not the daemon's environment
      *) env+=("$v") ;;
    esac
  done
  case $kind in
    warpfs)
      rm -f "$tmp/ab-aio-w.img"
      "$mkfs" -q --size 1024M "emu:$tmp/ab-aio-w.img" || return 1
      o="latency_us=$lat${opts:+,$opts}"
      "${env[@]}" "${bin:-$warpfs}" -f -o "$o" "emu:$tmp/ab-aio-w.img" "$mnt" 2>"$tmp/ab-aio-daemon.log" &
      ;;
    null) "${env[@]}" "${bin:-$null}" -f ${opts:+-o "$opts"} "$mnt" 2>"$tmp/ab-aio-daemon.log" & ;;
    pll)
      rm -rf "${src:?}"/*
      "${env[@]}" "${bin:-$pll}" -f -o "source=$src${opts:+,$opts}" "$mnt" 2>"$tmp/ab-aio-daemon.log" &
      ;;
    *) echo "ab_aio: unknown kind $kind" >&2; return 1 ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    mountpoint -q "$mnt" && return 0
    sleep 0.05
  done
  echo "ab_aio: $kind did not mount:" >&2
  cat "$tmp/ab-aio-daemon.log" >&2
  return 1
}
unmount_variant() {
  fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt"
  wait "$pid" 2>/dev/null
  pid=""
}

for r in $(seq "$rounds"); do
  for spec in "$@"; do
    name=${spec%%=*} rest=${spec#*=} vars=""
    [[ $rest == *@* ]] && vars=${rest%%@*} rest=${rest#*@}
    kind=${rest%%:*} opts=""
    [[ $rest == *:* ]] && opts=${rest#*:}
    mount_variant "$kind" "$opts" "$vars" || exit 1
    # A laid-out file (the null daemon drops the data and keeps the size: its reads are zeros).
    dd if=/dev/zero of="$mnt/f" bs=1M count=256 oflag=direct status=none || exit 1
    for j in $jobs; do
      IFS=: read -r rw qd nj <<<"$j"
      if out=$("$aioload" "$mnt/f" "$rw" 256 "$qd" "$nj" "$secs"); then
        iops=$(sed -E 's/.*"iops":([0-9]+).*/\1/' <<<"$out")
        echo "{\"variant\":\"$name\",\"round\":$r,\"rw\":\"$rw\",\"qd\":$qd,\"jobs\":$nj,\"iops\":$iops}"
      else
        echo "{\"variant\":\"$name\",\"round\":$r,\"rw\":\"$rw\",\"qd\":$qd,\"jobs\":$nj,\"error\":true}"
      fi
    done
    unmount_variant
  done
done
