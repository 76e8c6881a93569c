#!/usr/bin/env bash
# Many copies of warpfs-stress-mount at once, for machines with more cores than one run uses
# (the workload that once damaged warpfs: 8 processes x 10,000 operations and 2 sharers on a fresh 4 GiB image each).
#   usage: stress_mount_par.sh BASE_SEED COPIES SECONDS [OUTDIR]
# Copy I runs seeds BASE_SEED+1000*I, BASE_SEED+1000*I+1, ... and starts no new run after
# SECONDS; each copy's lines go to OUTDIR/logI.txt (a FAIL line names the seed to rerun, and
# its image is kept in OUTDIR/keepI). The programs come from the environment as for the
# harness itself: STRESS_MOUNT (the harness), WARPFS, MKFS, FSCK; images live in $TMPDIR
# (/dev/shm is a good place). Prints the counts; exits non-zero if any run failed.
set -uo pipefail
base=${1:?base seed} copies=${2:?copies} seconds=${3:?seconds} out=${4:-${OUT:-.}}
harness=${STRESS_MOUNT:-warpfs-stress-mount}
tmp=${TMPDIR:-/tmp}
for i in $(seq 0 $((copies - 1))); do
  mkdir -p "$tmp/stress-mount-par.$i" "$out/keep$i"
  TMPDIR=$tmp/stress-mount-par.$i "$harness" --seconds "$seconds" --seed $((base + 1000 * i)) \
    --procs 8 --sharers 2 --ops 10000 --verbose --keep "$out/keep$i" >"$out/log$i.txt" 2>&1 &
done
wait
ok=$(cat "$out"/log*.txt | grep -c '^ok')
failed=$(cat "$out"/log*.txt | grep -c '^FAIL')
grep -h '^FAIL' "$out"/log*.txt | cut -c1-300
echo "$ok passed, $failed failed"
[[ $failed -eq 0 ]]
