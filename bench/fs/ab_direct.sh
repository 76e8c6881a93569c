#!/usr/bin/env bash
# A/B of two warpfs daemons on O_DIRECT 4 KiB random I/O to one file (JOBS=random, the
# default; JOBS=reads: its read jobs alone, on a file only the layout wrote, so that no
# write job's dirty lines are left in the cache), on 1 MiB sequential I/O, O_DIRECT and
# buffered (JOBS=sequential), on 1 MiB O_DIRECT writes over a file the software cache holds a
# quarter of (JOBS=cached: 128 MiB of 4 KiB buffered random writes and an fsync first), or
# both random and sequential (JOBS=all), side by side in one
# run (rounds alternate A and B), zero and 80 µs emulated device latency. Used where
# bench/run fs cannot run (a machine without libfuse's examples or fuse2fs), e.g. the 16-core
# device machine with the binaries, their libraries and fio carried in.
#   usage: ab_direct.sh WARPFS_A WARPFS_B [ROUNDS]     (MKFS=mkfs.warpfs, fio and fusermount3
#          on PATH; the images go to TMPDIR, default /dev/shm). Two warpfs-null daemons (a
#          name containing "null") are compared the same way, without a device (latency 0).
#          OPTS_A and OPTS_B: more -o options for each side (e.g. OPTS_B=io_uring compares
#          a daemon with itself on the two transports).
# Prints one JSON object per job: {"variant","lat_us","job","iops","mb_s"} ("error": fio
# failed, its stderr is kept in $LOGS, default TMPDIR).
set -u
(($# >= 2)) || { sed -n 2,17p "$0" >&2; exit 2; }
declare -A bin=([A]=$1 [B]=$2)
declare -A opts=([A]=${OPTS_A:-} [B]=${OPTS_B:-})
rounds=${3:-3}
jobs=${JOBS:-random}
tmp=${TMPDIR:-/dev/shm}
logs=${LOGS:-$tmp}
mkfs=${MKFS:-mkfs.warpfs}
mnt=$(mktemp -d "$tmp/ab-mnt.XXXXXX")
pid=""
cleanup() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  [[ -n $pid ]] && wait "$pid" 2>/dev/null
  rm -rf "$mnt" "$tmp"/ab-*.img
}
trap cleanup EXIT
trap 'exit 130' INT TERM
job() {  # VARIANT LAT NAME FIO_ARGS...
  local v=$1 lat=$2 name=$3 j
  shift 3
  if ! j=$(fio --name="$name" --filename="$mnt/f" --size=256m --direct=1 --fallocate=none \
    --bs=4k --ioengine=libaio --runtime=4 --ramp_time=1 --time_based --group_reporting \
    --output-format=json "$@" 2>"$logs/ab-$v-$lat-$name.err"); then
    echo "{\"variant\":\"$v\",\"lat_us\":$lat,\"job\":\"$name\",\"error\":true}"
    return
  fi
  python3 -c 'import json,sys
v,lat,name=sys.argv[1],int(sys.argv[2]),sys.argv[3]
jb=json.load(sys.stdin)["jobs"][0]
r,w=jb["read"],jb["write"]
print(json.dumps({"variant":v,"lat_us":lat,"job":name,"iops":round(r["iops"]+w["iops"]),
                  "mb_s":round((r["bw_bytes"]+w["bw_bytes"])/1e6)}))' \
    "$v" "$lat" "$name" <<<"$j"
}
for ((round = 1; round <= rounds; ++round)); do
  for v in A B; do
    for lat in 0 80; do
      img=$tmp/ab-$v.img
      rm -f "$img"
      if [[ ${bin[$v]} == *null* ]]; then  # warpfs-null: no device, no latency
        ((lat == 0)) || continue
        "${bin[$v]}" -f ${opts[$v]:+-o "${opts[$v]}"} "$mnt" 2>"$logs/ab-$v-daemon.log" &
      else
        "$mkfs" -q --size 1024M "emu:$img" || exit 1
        "${bin[$v]}" -f -o "latency_us=$lat${opts[$v]:+,${opts[$v]}}" "emu:$img" "$mnt" \
          2>"$logs/ab-$v-daemon.log" &
      fi
      pid=$!
      for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
      mountpoint -q "$mnt" || { cat "$logs/ab-$v-daemon.log" >&2; exit 1; }
      # Written once in full, so that the random writes overwrite allocated, written blocks.
      fio --name=lay --filename="$mnt/f" --size=256m --bs=1m --rw=write --direct=1 \
        --fallocate=none --output=/dev/null || exit 1
      if [[ $jobs == reads ]]; then
        job $v $lat randread_qd32 --rw=randread --iodepth=32
        job $v $lat randread_qd32_4jobs --rw=randread --iodepth=8 --numjobs=4
        job $v $lat randread_qd1 --rw=randread --iodepth=1
      elif [[ $jobs == cached ]]; then
        fio --name=warm --filename="$mnt/f" --size=256m --bs=4k --rw=randwrite --io_size=128m \
          --fallocate=none --end_fsync=1 --output=/dev/null || exit 1
        job $v $lat seqwrite_1m_cached --rw=write --bs=1m --iodepth=1
      elif [[ $jobs != sequential ]]; then
        job $v $lat randwrite_qd32 --rw=randwrite --iodepth=32
        job $v $lat randwrite_qd32_4jobs --rw=randwrite --iodepth=8 --numjobs=4
        job $v $lat randread_qd32 --rw=randread --iodepth=32
        job $v $lat randread_qd1 --rw=randread --iodepth=1
        job $v $lat randwrite_qd1 --rw=randwrite --iodepth=1
        job $v $lat randwrite_psync4 --rw=randwrite --iodepth=1 --numjobs=4 --ioengine=psync
      fi
      if [[ $jobs == sequential || $jobs == all ]]; then
        job $v $lat seqwrite_1m --rw=write --bs=1m --iodepth=1
        job $v $lat seqread_1m --rw=read --bs=1m --iodepth=1
        job $v $lat seqwrite_1m_buffered --rw=write --bs=1m --direct=0 --ioengine=psync
      fi
      fusermount3 -u "$mnt"
      wait "$pid"
      pid=""
      rm -f "$img"
    done
  done
done
