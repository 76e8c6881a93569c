#!/bin/sh
# The steps run inside the QEMU guest (busybox sh) against the emulated NVMe controller:
# bind it to vfio-pci, then drive it through warpfs's VFIO transport (the driver's tests,
# mkfs, a FUSE mount with a workload, a remount that checks it, fsck).
#   usage: guest-tests.sh BDF single|multi       (from /init)
#          guest-tests.sh - nfs                  (from /init: the steps of guest-nfs.sh)
#          guest-tests.sh --run FUNCTION ARGS... (one step, started by step())
# Each step prints `WARPFS-STEP NAME PASS|FAIL`; run-guest.sh counts them.
#
# A step runs in its own session (setsid), so that one that outlives its time limit is
# killed with everything it started. Steps share state through files in $state; the FUSE
# daemon started by `mount` outlives that step, so its exit status reaches `unmount` through
# a file written by the subshell that waits for it (the shell of `unmount` cannot `wait` for
# a process it did not start).
state=/tmp/warpfs-guest
self=/guest-tests.sh
step_timeout=120  # seconds, unless the step says otherwise
# The nfs configuration's steps (warpfs exported by the kernel's NFS server).
# shellcheck disable=SC1091 # the guest's copy of tests/vfio/guest-nfs.sh
[ -f /guest-nfs.sh ] && . /guest-nfs.sh

have() { command -v "$1" >/dev/null 2>&1; }

# Ends the current step with a message (steps run in a subshell of the runner).
fail() {
  echo "  FAIL: $*"
  exit 1
}

# True if step $1 passed.
passed() { [ "$(cat "$state/result.$1" 2>/dev/null)" = PASS ]; }
requires() {
  for r in "$@"; do passed "$r" || fail "skipped: step '$r' did not pass"; done
}

# wait_until SECONDS MESSAGE COMMAND...: polls COMMAND every 0.1 s; fails with MESSAGE if it
# has not succeeded within SECONDS (a bounded poll, never a sleep as synchronisation).
wait_until() {
  wu_ticks=$(($1 * 10))
  wu_msg=$2
  shift 2
  until "$@"; do
    [ "$wu_ticks" -gt 0 ] || fail "$wu_msg"
    sleep 0.1
    wu_ticks=$((wu_ticks - 1))
  done
}
daemon_exited() { [ -e "$state/daemon.rc" ]; }

# step [-t SECONDS] NAME FUNCTION ARGS...: runs FUNCTION in a new session with a time limit
# and prints the verdict line.
step() {
  limit=$step_timeout
  if [ "$1" = -t ]; then
    limit=$2
    shift 2
  fi
  name=$1
  shift
  echo "--- step $name (limit ${limit}s, at $(cut -d' ' -f1 /proc/uptime) s)"
  rm -f "$state/step.rc" "$state/step.pgid"
  setsid sh "$self" --run "$@" </dev/null &
  pid=$!
  ticks=0
  # A bounded poll for the runner's status file: the runner may have exited already, and a
  # not yet reaped child still answers kill -0.
  while [ ! -e "$state/step.rc" ]; do
    if [ "$ticks" -ge $((limit * 10)) ]; then
      echo "  step $name: no result after ${limit}s; killing it"
      kill -KILL "-$(cat "$state/step.pgid" 2>/dev/null || echo "$pid")" 2>/dev/null
      break
    fi
    sleep 0.1
    ticks=$((ticks + 1))
  done
  wait "$pid" 2>/dev/null
  rc=$(cat "$state/step.rc" 2>/dev/null || echo "killed (time limit)")
  if [ "$rc" = 0 ]; then
    echo PASS >"$state/result.$name"
    echo "WARPFS-STEP $name PASS"
  else
    echo FAIL >"$state/result.$name"
    echo "  step $name: status $rc"
    echo "WARPFS-STEP $name FAIL"
  fi
}

# ------------------------------------------------------------------------------------------
# PCI details of the controller, for the log (not a step).

cfg_u8() { od -An -tu1 -j "$1" -N1 "/sys/bus/pci/devices/$BDF/config" | tr -d ' '; }
cfg_u16() { od -An -tu2 -j "$1" -N2 "/sys/bus/pci/devices/$BDF/config" | tr -d ' '; }
cfg_u32() { od -An -tu4 -j "$1" -N4 "/sys/bus/pci/devices/$BDF/config" | tr -d ' '; }

pci_info() {
  dev=/sys/bus/pci/devices/$BDF
  echo "pci: $BDF class $(cat "$dev/class") id $(cat "$dev/vendor"):$(cat "$dev/device")"
  bar=0
  while read -r start end flags; do
    if [ "$bar" -le 5 ] && [ "$((start))" != 0 ]; then
      printf 'pci:   BAR%d at %#x, %d KiB, flags %s\n' "$bar" "$((start))" \
        $(((end - start + 1) / 1024)) "$flags"
    fi
    bar=$((bar + 1))
  done <"$dev/resource"
  # The capability list (PCI Local Bus 3.0, 6.7): MSI-X's table and PBA (BAR and offset).
  if [ $(($(cfg_u16 6) & 0x10)) != 0 ]; then
    ptr=$(($(cfg_u8 0x34) & 0xfc))
    hops=0
    while [ "$ptr" != 0 ] && [ "$hops" -lt 48 ]; do
      id=$(cfg_u8 "$ptr")
      if [ "$id" = 17 ]; then  # MSI-X
        ctl=$(cfg_u16 $((ptr + 2)))
        tbl=$(cfg_u32 $((ptr + 4)))
        pba=$(cfg_u32 $((ptr + 8)))
        printf 'pci:   MSI-X: %d vectors, table in BAR%d at %#x (%d bytes), PBA in BAR%d at %#x\n' \
          $(((ctl & 0x7ff) + 1)) $((tbl & 7)) $((tbl & ~7)) $((((ctl & 0x7ff) + 1) * 16)) \
          $((pba & 7)) $((pba & ~7))
      else
        printf 'pci:   capability %#x at %#x\n' "$id" "$ptr"
      fi
      ptr=$(($(cfg_u8 $((ptr + 1))) & 0xfc))
      hops=$((hops + 1))
    done
  fi
}

# ------------------------------------------------------------------------------------------
# The steps.

# sysfs_bind [BDF]: the controller (default $BDF) to vfio-pci.
sysfs_bind() {
  sb=${1:-$BDF}
  dev=/sys/bus/pci/devices/$sb
  [ -e "$dev/driver" ] && echo "$sb" >"$dev/driver/unbind"
  echo vfio-pci >"$dev/driver_override"
  echo "$sb" >/sys/bus/pci/drivers_probe
}

do_bind() {
  dev=/sys/bus/pci/devices/$BDF
  ok=1
  if have warpfs-pci; then
    echo "warpfs-pci bind $BDF vfio-pci"
    if ! warpfs-pci bind "$BDF" vfio-pci; then
      echo "  warpfs-pci bind failed; binding through sysfs so that the later steps can run"
      ok=0
      sysfs_bind
    fi
  else
    echo "(no warpfs-pci) binding through driver_override and drivers_probe"
    sysfs_bind
  fi
  drv=$(readlink "$dev/driver")
  [ "${drv##*/}" = vfio-pci ] || fail "$BDF is bound to '${drv##*/}', not vfio-pci"
  group=$(readlink "$dev/iommu_group") || fail "$BDF has no IOMMU group (is the IOMMU on?)"
  group=${group##*/}
  [ -c "/dev/vfio/$group" ] || fail "/dev/vfio/$group is missing"
  echo "$BDF: driver vfio-pci, IOMMU group $group with:" /sys/kernel/iommu_groups/"$group"/devices/*
  echo "/dev/vfio:" /dev/vfio/*
  [ "$ok" = 1 ] || fail "warpfs-pci bind failed"
}

do_list() {
  out=$(warpfs-pci list 2>&1) || {
    echo "$out"
    fail "warpfs-pci list exited with an error"
  }
  echo "$out"
  echo "$out" | grep -e "$BDF" -e "${BDF#0000:}" | grep -q vfio-pci ||
    fail "the list has no line with $BDF and vfio-pci"
}

# Every carried program of the list (default: warpfs's) starts: its libraries are all in the
# initramfs (status 127 says not).
do_binaries() {
  [ $# -gt 0 ] || set -- nvme_tests mkfs.warpfs fsck.warpfs warpfs warpfs-fsx warpfs-pci
  ok=1
  for prog in "$@"; do
    if ! have "$prog"; then
      echo "  $prog: not carried"
      continue
    fi
    if [ "$prog" = nvme_tests ]; then
      out=$(nvme_tests --gtest_list_tests 2>&1)
      rc=$?
      [ "$rc" = 0 ] && out="$(echo "$out" | grep -c '^  ') tests"
    else
      out=$("$prog" --help 2>&1)
      rc=$?
    fi
    if [ "$rc" = 127 ] || [ "$rc" -ge 128 ]; then
      echo "  $prog: status $rc: $out"
      ok=0
    else
      echo "  $prog: starts ($(echo "$out" | head -1))"
    fi
  done
  [ "$ok" = 1 ] || fail "a program does not start"
}

# A controller that does not exist: an error that names it, not a crash or a hang.
do_missing_device() {
  have mkfs.warpfs || fail "mkfs.warpfs not carried"
  out=$(mkfs.warpfs vfio:0000:99:00.0 2>&1)
  rc=$?
  echo "  mkfs.warpfs vfio:0000:99:00.0: status $rc: $out"
  [ "$rc" != 0 ] || fail "mkfs.warpfs succeeded on a missing controller"
  [ "$rc" -lt 128 ] || fail "mkfs.warpfs died of a signal"
  echo "$out" | grep -q '0000:99:00.0' || fail "the message does not name the device"
}

# A user whose locked-memory limit is too small for the DMA memory: the pinning fails and the
# message says what to raise. (The group is opened up to the user for this step only.)
do_memlock() {
  requires bind
  have mkfs.warpfs || fail "mkfs.warpfs not carried"
  group=$(readlink "/sys/bus/pci/devices/$BDF/iommu_group")
  group=${group##*/}
  grep -q '^nobody:' /etc/passwd 2>/dev/null || echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >>/etc/passwd
  chmod 666 "/dev/vfio/$group"
  out=$(su nobody -s /bin/sh -c "ulimit -l 64; mkfs.warpfs --force $DEVICE" 2>&1)
  rc=$?
  chmod 600 "/dev/vfio/$group"
  echo "  as nobody with ulimit -l 64: status $rc: $out"
  [ "$rc" != 0 ] || fail "mkfs.warpfs succeeded with 64 KiB of locked memory"
  [ "$rc" -lt 128 ] || fail "mkfs.warpfs died of a signal"
  echo "$out" | grep -q "locked-memory limit" || fail "the message does not name the locked-memory limit"
}

do_driver_tests() {
  requires bind
  have nvme_tests || fail "nvme_tests not carried"
  WARPFS_NVME_TEST_DEVICE=$TEST_DEVICE GTEST_COLOR=no GTEST_BRIEF=1 nvme_tests ||
    fail "nvme_tests (WARPFS_NVME_TEST_DEVICE=$TEST_DEVICE)"
}

do_mkfs() {
  case $DEVICE in vfio:*) requires bind ;; esac  # an emulated device needs no binding
  have mkfs.warpfs || fail "mkfs.warpfs not carried"
  # shellcheck disable=SC2086 # MKFS_OPTS is a list of options
  mkfs.warpfs $MKFS_OPTS "$DEVICE" || fail "mkfs.warpfs $DEVICE"
}

# Where the filesystem is mounted: /mnt, or the MNT the configuration sets (nfs: /mnt/w).
MNT=${MNT:-/mnt}
is_mounted() { awk -v m="$MNT" '$2 == m && $3 ~ /^fuse/ { f = 1 } END { exit !f }' /proc/mounts; }

# Starts the daemon in the foreground of a background subshell that records its status,
# and returns once the mount shows in /proc/mounts (or the daemon has exited).
do_mount() {
  requires mkfs
  have warpfs || fail "warpfs not carried"
  [ -c /dev/fuse ] || fail "no /dev/fuse (the fuse module)"
  is_mounted && fail "$MNT is mounted already"
  rm -f "$state/daemon.rc"
  (
    warpfs -f -o "stats=$state/stats.json" "$DEVICE" "$MNT" >"$state/daemon.log" 2>&1
    echo $? >"$state/daemon.rc.tmp"
    mv "$state/daemon.rc.tmp" "$state/daemon.rc"
  ) </dev/null &
  ticks=0
  while [ "$ticks" -lt 600 ]; do
    if is_mounted; then
      echo "  $(grep " $MNT " /proc/mounts)"
      return 0
    fi
    if [ -e "$state/daemon.rc" ]; then
      cat "$state/daemon.log"
      fail "warpfs exited with status $(cat "$state/daemon.rc") before mounting"
    fi
    sleep 0.1
    ticks=$((ticks + 1))
  done
  cat "$state/daemon.log"
  fail "no mount on $MNT after 60 s"
}

# umount, then the daemon must exit by itself with status 0 (bounded wait).
do_unmount() {
  is_mounted || fail "$MNT is not mounted"
  umount "$MNT" || fail "umount $MNT"
  wait_until 120 "warpfs still running 120 s after umount" daemon_exited
  rc=$(cat "$state/daemon.rc")
  if [ "$rc" != 0 ]; then
    cat "$state/daemon.log"
    fail "warpfs exited with status $rc"
  fi
}

# Checks the tree under /mnt/data against the sums and the listing recorded by the workload.
check_data() {
  out=$(cd /mnt/data && sha256sum -c "$state/sums" 2>&1) || {
    echo "$out" | grep -v ': OK$'
    fail "file contents differ"
  }
  (cd /mnt/data && find . | sort) >"$state/listing.now"
  diff "$state/listing" "$state/listing.now" || fail "the directory tree differs"
  echo "  $(wc -l <"$state/sums") files and $(wc -l <"$state/listing") names verified"
}

# churn DIR COUNT: files DIR/f0.. holding their number; the even ones are removed, the odd
# ones renamed to gN.
churn() {
  n=0
  while [ "$n" -lt "$2" ]; do
    echo "$n" >"$1/f$n" || fail "create $1/f$n"
    n=$((n + 1))
  done
  n=0
  while [ "$n" -lt "$2" ]; do
    rm "$1/f$n" || fail "rm $1/f$n"
    mv "$1/f$((n + 1))" "$1/g$((n + 1))" || fail "mv $1/f$((n + 1))"
    n=$((n + 2))
  done
}

do_workload() {
  is_mounted || fail "/mnt is not mounted"
  src=$state/src
  rm -rf "$src"
  mkdir -p "$src" || fail "mkdir $src"
  for size in 1 1000 1024 4096 12345 65536 1048576 4194305 16777216; do
    head -c "$size" /dev/urandom >"$src/file.$size" || fail "writing $src/file.$size"
  done
  i=1
  for d in a b c; do
    for e in 1 2 3; do
      mkdir -p "$src/tree/$d/$e/deep"
      echo "$d$e" >"$src/tree/$d/$e/name"
      head -c $((i * 3001)) /dev/urandom >"$src/tree/$d/$e/deep/data"
      i=$((i + 1))
    done
  done
  ln -s ../../file.1 "$src/tree/a/link"
  (cd "$src" && find . -type f | sort | xargs sha256sum) >"$state/sums" || fail "sha256sum"
  (cd "$src" && find . | sort) >"$state/listing"

  mkdir /mnt/data || fail "mkdir /mnt/data"
  cp -a "$src/." /mnt/data/ || fail "cp -a into /mnt/data"
  check_data

  # Churn beside it: many small files, half of them removed, the rest renamed.
  mkdir /mnt/churn || fail "mkdir /mnt/churn"
  churn /mnt/churn 200
  [ "$(find /mnt/churn -type f | wc -l)" = 100 ] || fail "/mnt/churn does not hold 100 files"

  if have warpfs-fsx; then
    warpfs-fsx -q -N 3000 -S 1 /mnt/fsx.file || fail "warpfs-fsx"
  else
    echo "  (warpfs-fsx not carried)"
  fi
  sync
}

do_verify() {
  is_mounted || fail "/mnt is not mounted"
  check_data
  [ "$(find /mnt/churn -type f | wc -l)" = 100 ] || fail "/mnt/churn does not hold 100 files"
}

# A stats field of the running daemon (SIGUSR1 makes it write $state/stats.json).
stat_field() {
  sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$state/stats.json"
}
dump_stats() {
  rm -f "$state/stats.json"
  kill -USR1 "$(pidof warpfs)" || fail "no warpfs to signal"
  wait_until 10 "no stats after SIGUSR1" test -s "$state/stats.json"
}

# The daemon over VFIO: MSI-X interrupts arrived, DMA memory came from hugepages when the
# guest reserved some (multi) and from plain pages otherwise (single), and an idle mount
# uses no CPU: the device's completions wake it through eventfds, nothing polls.
do_device_stats() {
  is_mounted || fail "/mnt is not mounted"
  dump_stats
  cat "$state/stats.json"
  [ "$(stat_field transport)" = "\"$DEVICE_NAME\"" ] || fail "transport is $(stat_field transport)"
  case $DEVICE in
    vfio:*)
      [ "$(stat_field interrupts)" -gt 0 ] || fail "no MSI-X interrupts were delivered"
      [ "$(stat_field dma_bytes)" -gt 0 ] || fail "no DMA memory mapped"
      huge=$(stat_field hugepage_bytes)
      if [ "$(cat /proc/sys/vm/nr_hugepages)" -gt 0 ]; then
        [ "$huge" -gt 0 ] || fail "hugepages are reserved but the DMA memory does not use them"
      else
        [ "$huge" = 0 ] || fail "hugepage bytes reported with no hugepages reserved"
      fi
      ;;
  esac
  pid=$(pidof warpfs)
  sync
  # An idle daemon uses (almost) no CPU. A window over budget is measured once more: an idle
  # daemon that spins fails both, while a one-off (the emulated guest's clock under a loaded
  # host charged one busy tick after another to it once in CI) passes the second. Each
  # window over budget names the threads that used the CPU.
  for window in 1 2; do
    a=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    thread_ticks >/tmp/idle-threads-a
    irq_a=$(stat_field interrupts)
    irq_a=${irq_a:-0}
    sleep 10
    b=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    thread_ticks >/tmp/idle-threads-b
    irq_b=$(stat_field interrupts)
    irq_b=${irq_b:-0}
    echo "  idle for 10 s: $((b - a)) ticks of CPU (of $((10 * $(getconf CLK_TCK 2>/dev/null || echo 100)))), $((irq_b - irq_a)) interrupts"
    [ "$((b - a))" -le 5 ] && break
    echo "  ticks by thread in that window:"
    awk 'NR == FNR {a[$1] = $2; next} $2 - a[$1] > 0 {print "    " $1 " " $3 ": " $2 - a[$1]}' \
      /tmp/idle-threads-a /tmp/idle-threads-b
    [ "$window" = 1 ] || fail "an idle mount used $((b - a)) ticks in 10 s, twice"
  done
  dump_stats
}

# One line per thread of the daemon ($pid): "TID TICKS NAME".
thread_ticks() {
  for t in /proc/"$pid"/task/*; do
    echo "$(basename "$t") $(awk '{print $14 + $15}' "$t/stat" 2>/dev/null || echo 0) $(cat "$t/comm" 2>/dev/null)"
  done
}

# kill -9 of the daemon after an fsync: the kernel closes the VFIO group and resets the
# function; the next mount replays the journal and the fsync'd file is there.
do_kill9() {
  is_mounted || fail "/mnt is not mounted"
  head -c 300000 /dev/urandom >"$state/k9.src"
  cp "$state/k9.src" /mnt/k9 || fail "write /mnt/k9"
  sync /mnt/k9 2>/dev/null || sync
  kill -KILL "$(pidof warpfs)" || fail "kill -9"
  wait_until 10 "the daemon did not die" daemon_exited
  umount /mnt 2>/dev/null || umount -l /mnt || fail "umount of the dead mount"
  do_mount
  cmp "$state/k9.src" /mnt/k9 || fail "the fsync'd file differs after kill -9 and remount"
  check_data
}

# SIGTERM: the daemon unmounts, leaves the superblock clean and exits 0.
do_sigterm() {
  is_mounted || fail "/mnt is not mounted"
  kill -TERM "$(pidof warpfs)" || fail "kill -TERM"
  wait_until 120 "warpfs still running 120 s after SIGTERM" daemon_exited
  [ "$(cat "$state/daemon.rc")" = 0 ] || fail "warpfs exited with status $(cat "$state/daemon.rc") after SIGTERM"
  is_mounted && fail "/mnt is still mounted after SIGTERM"
  return 0
}

# warpfs-pci refuses to take the controller from a running warpfs (it holds /dev/vfio/N).
do_in_use() {
  have warpfs-pci || fail "warpfs-pci not carried"
  is_mounted || fail "/mnt is not mounted"
  out=$(warpfs-pci bind "$BDF" nvme 2>&1) && fail "warpfs-pci moved the controller of a mounted warpfs"
  echo "  warpfs-pci bind $BDF nvme: $out"
  echo "$out" | grep -q warpfs || fail "the refusal does not name the warpfs process"
  drv=$(readlink "/sys/bus/pci/devices/$BDF/driver")
  [ "${drv##*/}" = vfio-pci ] || fail "the controller moved to '${drv##*/}' anyway"
}

listed_with_namespaces() {
  warpfs-pci list | grep "$BDF\|${BDF#0000:}" | grep -q 'nvme[0-9]*n[0-9]'
}

# The controller to the kernel's nvme driver (its namespaces appear as block devices) and
# back to vfio-pci; the filesystem on it is untouched.
do_to_nvme_and_back() {
  have warpfs-pci || fail "warpfs-pci not carried"
  while read -r m; do
    [ -n "$m" ] || continue
    [ -e "/sys/module/$(echo "$m" | tr - _)" ] && continue
    insmod "/modules/later/$m.ko" || fail "insmod $m"
  done </modules/later/order
  warpfs-pci bind "$BDF" nvme || fail "warpfs-pci bind $BDF nvme"
  drv=$(readlink "/sys/bus/pci/devices/$BDF/driver")
  [ "${drv##*/}" = nvme ] || fail "the controller is bound to '${drv##*/}', not nvme"
  wait_until 30 "no namespace block device within 30 s" listed_with_namespaces
  warpfs-pci list
  warpfs-pci bind "$BDF" vfio-pci || fail "warpfs-pci bind $BDF vfio-pci (back)"
  drv=$(readlink "/sys/bus/pci/devices/$BDF/driver")
  [ "${drv##*/}" = vfio-pci ] || fail "the controller is bound to '${drv##*/}', not vfio-pci"
  fsck.warpfs -f -n "$DEVICE" || fail "fsck after the round trip through the nvme driver"
}

do_fsck() {
  requires mkfs
  have fsck.warpfs || fail "fsck.warpfs not carried"
  fsck.warpfs -f -n "$DEVICE" || fail "fsck.warpfs -f -n $DEVICE"
}

# multi: a RAID 1 of the first controller's namespace 1 (untouched by the steps before: a
# namespace the driver's tests wrote holds no zeroes where mkfs deallocates, and QEMU's
# Deallocate without discard=unmap leaves the data) and the second controller's namespace,
# whose image fails every write covering one sector 12 MiB into the set's data
# (run-guest.sh). A small file first, then a 16 MiB one that crosses the sector: the member
# fails mid-write, the writes still succeed (the mirror took them), the daemon's stats say
# degraded, the daemon exits 0, fsck is clean and names the failed member, and a second
# mount (reading the survivor) returns both files as written.
raid_mount() {
  rm -f "$state/raid.rc"
  (
    warpfs -f -o "stats=$state/raid.json" "$RAID" "$MNT" >"$state/raid.log" 2>&1
    echo $? >"$state/raid.rc.tmp"
    mv "$state/raid.rc.tmp" "$state/raid.rc"
  ) </dev/null &
  wait_until 60 "no mount of the RAID set on $MNT after 60 s" is_mounted
}
raid_unmount() {
  umount "$MNT" || fail "umount $MNT"
  wait_until 120 "warpfs still running 120 s after umount" test -e "$state/raid.rc"
  [ "$(cat "$state/raid.rc")" = 0 ] || {
    cat "$state/raid.log"
    fail "warpfs on the RAID set exited with status $(cat "$state/raid.rc")"
  }
}
do_raid_faults() {
  requires fsck
  [ -n "$BDF2" ] || fail "no second NVMe controller"
  drv=$(readlink "/sys/bus/pci/devices/$BDF/driver")
  [ "${drv##*/}" = vfio-pci ] || fail "$BDF is bound to '${drv##*/}', not vfio-pci"
  sysfs_bind "$BDF2"
  drv=$(readlink "/sys/bus/pci/devices/$BDF2/driver")
  [ "${drv##*/}" = vfio-pci ] || fail "$BDF2 is bound to '${drv##*/}', not vfio-pci"
  RAID=vfio:$BDF,ns=1,vfio:$BDF2
  MNT=/mnt/raid
  mkdir -p "$MNT"
  mkfs.warpfs -q --raid 1 "vfio:$BDF,ns=1" "vfio:$BDF2" || fail "mkfs.warpfs --raid 1"
  raid_mount
  head -c 4194304 /dev/urandom >"$MNT/a" || fail "writing a"
  sync
  # fsync'd (conv=fsync): b's blocks reach the members now, not from the daemon's cache at
  # unmount.
  yes warpfs-raid | head -c 16777216 | dd of="$MNT/b" bs=1M conv=fsync 2>/dev/null ||
    fail "writing b"
  (cd "$MNT" && sha256sum a b) >"$state/raid.sums"
  rm -f "$state/raid.json"
  kill -USR1 "$(pidof warpfs)" || fail "no warpfs to signal"
  wait_until 10 "no stats after SIGUSR1" test -s "$state/raid.json"
  tr -d ' \n' <"$state/raid.json" | grep -o '"raid":{[^}]*}'
  tr -d ' \n' <"$state/raid.json" | grep -q '"degraded":true' ||
    fail "the set is not degraded: the member's write fault never reached warpfs"
  raid_unmount
  grep "failed" "$state/raid.log"
  out=$(fsck.warpfs -f -n "$RAID" 2>&1) || {
    echo "$out"
    fail "fsck.warpfs -f -n of the degraded set"
  }
  echo "$out"
  echo "$out" | grep -q "is degraded: member 1 (vfio:$BDF2) failed" ||
    fail "fsck does not report member 1 failed"
  raid_mount
  (cd "$MNT" && sha256sum -c "$state/raid.sums") || fail "file contents differ after the fault"
  raid_unmount
}

# ------------------------------------------------------------------------------------------

# One step, as step() starts it (SCRIPT --run FUNCTION ARGS...): its status goes to
# $state/step.rc. guest-tcp.sh's entry point calls it too.
run_one_step() {
  shift
  echo $$ >"$state/step.pgid"
  ("$@")
  rc=$?
  echo "$rc" >"$state/step.rc.tmp"
  mv "$state/step.rc.tmp" "$state/step.rc"
  exit "$rc"
}

if [ "$1" = --run ]; then  # one step: its status goes to $state/step.rc
  run_one_step "$@"
fi

if [ "$2" = nfs ]; then
  rm -rf "$state"
  mkdir -p "$state"
  nfs_steps
  exit
fi

BDF=${1:?BDF}
CONFIG=${2:-single}
DEVICE=vfio:$BDF
DEVICE_NAME=vfio:$BDF  # the transport's name in the daemon's stats
TEST_DEVICE=vfio:$BDF  # where the driver's tests run
BDF2=  # multi: the second controller (the RAID step's faulty member)
if [ "$CONFIG" = multi ]; then
  for dev in /sys/bus/pci/devices/*; do
    [ "${dev##*/}" != "$BDF" ] && [ "$(cat "$dev/class")" = 0x010802 ] && BDF2=${dev##*/} && break
  done
  DEVICE=$DEVICE,ns=2            # namespace 1 is too small on purpose
  TEST_DEVICE=$TEST_DEVICE,ns=3  # the driver's tests on yet another namespace
  # DMA memory from hugepages (the cache's arena and the I/O buffers are >= 1 MiB).
  echo 64 >/proc/sys/vm/nr_hugepages
  echo "hugepages reserved: $(cat /proc/sys/vm/nr_hugepages)"
fi
# single: the driver's tests have left their patterns on the namespace. multi: they ran on
# namespace 3, so namespace 2 must still be empty and mkfs needs no --force.
MKFS_OPTS=--force
[ "$CONFIG" = multi ] && MKFS_OPTS=
# The harness's own test (run-guest.sh with WARPFS_VM_SELFTEST=1): the filesystem steps use
# an emulated controller over an image in the guest's tmpfs instead of the VFIO device.
if [ "${WARPFS_GUEST_SELFTEST:-0}" = 1 ]; then
  DEVICE=emu:/tmp/selftest.img
  DEVICE_NAME=emulated
  MKFS_OPTS="--force --size 512M"
  echo "self-test: the filesystem steps use $DEVICE"
fi
export BDF BDF2 CONFIG DEVICE DEVICE_NAME TEST_DEVICE MKFS_OPTS
rm -rf "$state"
mkdir -p "$state"

pci_info
step bind do_bind
have warpfs-pci && step list do_list
step binaries do_binaries
step missing-device do_missing_device
case $DEVICE in vfio:*) step memlock do_memlock ;; esac
step -t 300 driver-tests do_driver_tests
step mkfs do_mkfs
step mount do_mount
step -t 300 workload do_workload
step unmount do_unmount
step remount do_mount
step verify do_verify
have warpfs-pci && step in-use do_in_use
step device-stats do_device_stats
step kill9 do_kill9
step sigterm do_sigterm
step fsck do_fsck
case $DEVICE in vfio:*) have warpfs-pci && step to-nvme-and-back do_to_nvme_and_back ;; esac
case $DEVICE in vfio:*) [ "$CONFIG" = multi ] && step -t 300 raid-faults do_raid_faults ;; esac
