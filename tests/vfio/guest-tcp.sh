#!/bin/sh
# The tcp configuration's steps, inside the QEMU guest (busybox sh): the kernel's NVMe/TCP
# target (nvmet, nvmet-tcp) exports namespaces backed by files in the guest's memory on
# 127.0.0.1:4420, and warpfs drives them through its NVMe/TCP transport: the driver's tests,
# mkfs, a FUSE mount with the workload of guest-tests.sh, a remount, fsck, then the port taken
# away in the middle of writes and given back.
#   usage: guest-tcp.sh                        (from /init; warpfs.bench=1 on the kernel
#                                               command line: bench/tcp-guest.sh's benchmark)
#          guest-tcp.sh --run FUNCTION ARGS... (one step, started by step())
# Each step prints `WARPFS-STEP NAME PASS|FAIL`; run-guest.sh counts them.
#
# The step machinery (step, fail, requires, wait_until) and the filesystem steps (do_mkfs,
# do_mount, do_workload, do_unmount, do_verify, do_fsck, ...) are guest-tests.sh's: its
# definitions, everything above its entry point, are loaded from it.
state=/tmp/warpfs-guest
sed '/^if \[ "\$1" = --run \]; then/,$d' /guest-tests.sh >/tmp/guest-lib.sh
# shellcheck disable=SC1091 # the guest's copy of tests/vfio/guest-tests.sh, cut above
. /tmp/guest-lib.sh
# shellcheck disable=SC2034 # read by step(), loaded from guest-tests.sh
self=/guest-tcp.sh
command -v do_workload >/dev/null 2>&1 || {
  echo "guest-tcp: guest-tests.sh's definitions did not load (its entry point moved?)"
  echo "WARPFS-STEP load-steps FAIL"
  exit 1
}

NQN=nqn.2026-11.org.warpfs:guest-tcp
PORT_DIR=/sys/kernel/config/nvmet/ports/1
SUBSYS_DIR=/sys/kernel/config/nvmet/subsystems/$NQN
TARGET=tcp:127.0.0.1:4420/$NQN

# Namespace 1 (256 MiB) holds the filesystem: a file in the guest's tmpfs, so nvmet's file
# backend with 4 KiB LBAs (the file's block size). Namespace 2 (64 MiB) holds the driver's
# tests: a RAM disk (brd), so nvmet's block device backend with 512 B LBAs; it zeroes with
# Write Zeroes where tmpfs has no FALLOC_FL_ZERO_RANGE (the file backend answers ONCS Not
# Supported).
do_loopback() {
  ip link set lo up || fail "ip link set lo up"
  ip addr show lo | grep -q 'inet 127\.0\.0\.1' || ip addr add 127.0.0.1/8 dev lo ||
    fail "no 127.0.0.1 on lo"
  ip addr show lo | sed 's/^/  /'
}

do_export() {
  requires loopback
  grep -q ' /sys/kernel/config ' /proc/mounts ||
    mount -t configfs none /sys/kernel/config || fail "mount configfs"
  [ -d /sys/kernel/config/nvmet ] || fail "no /sys/kernel/config/nvmet (nvmet not loaded?)"
  mkdir "$SUBSYS_DIR" || fail "mkdir $SUBSYS_DIR"
  echo 1 >"$SUBSYS_DIR/attr_allow_any_host" || fail "attr_allow_any_host"
  [ -b /dev/ram0 ] || insmod /modules/later/brd.ko rd_nr=1 rd_size=65536 max_part=0 ||
    fail "insmod brd"
  [ -b /dev/ram0 ] || fail "no /dev/ram0 after insmod brd"
  truncate -s 256M /tmp/ns1.img || fail "truncate /tmp/ns1.img"
  for n in 1 2; do
    path=/tmp/ns1.img
    [ "$n" = 2 ] && path=/dev/ram0
    mkdir "$SUBSYS_DIR/namespaces/$n" || fail "mkdir namespace $n"
    echo "$path" >"$SUBSYS_DIR/namespaces/$n/device_path" || fail "device_path $n"
    # tmpfs has no O_DIRECT (in 6.1): the file backend must use the page cache.
    [ "$n" = 1 ] && { echo 1 >"$SUBSYS_DIR/namespaces/$n/buffered_io" || fail "buffered_io $n"; }
    echo 1 >"$SUBSYS_DIR/namespaces/$n/enable" || fail "enable namespace $n"
  done
  mkdir "$PORT_DIR" || fail "mkdir $PORT_DIR"
  echo tcp >"$PORT_DIR/addr_trtype"
  echo ipv4 >"$PORT_DIR/addr_adrfam"
  echo 127.0.0.1 >"$PORT_DIR/addr_traddr"
  echo 4420 >"$PORT_DIR/addr_trsvcid"
  ln -s "$SUBSYS_DIR" "$PORT_DIR/subsystems/$NQN" || fail "linking the subsystem to the port"
  netstat -ltn 2>/dev/null | grep -q '127.0.0.1:4420' || fail "nothing listens on 127.0.0.1:4420"
  echo "  $NQN on tcp 127.0.0.1:4420: namespaces 1 (/tmp/ns1.img, 256 MiB) and 2 (/dev/ram0, 64 MiB)"
}

# The driver's suite against nvmet; tests about what a fabrics controller has not (PCIe
# registers, queue memory the controller fetches, the emulated model) skip with a reason.
do_tcp_driver_tests() {
  requires export
  have nvme_tests || fail "nvme_tests not carried"
  WARPFS_NVME_TEST_DEVICE=$TARGET,ns=2 GTEST_COLOR=no GTEST_BRIEF=1 nvme_tests ||
    fail "nvme_tests (WARPFS_NVME_TEST_DEVICE=$TARGET,ns=2)"
}

# warpfs --list-devices tcp:127.0.0.1:4420 asks nvmet's discovery controller (every nvmet
# port serves one) for its log page: the subsystem comes back as a DEVICE name that opens.
do_discovery() {
  requires export
  out=$(warpfs --list-devices tcp:127.0.0.1:4420 2>&1) || {
    echo "$out"
    fail "warpfs --list-devices tcp:127.0.0.1:4420 exited with an error"
  }
  echo "$out" | sed 's/^/  /'
  echo "$out" | grep -qx "$TARGET" || fail "no line '$TARGET'"
  [ "$(echo "$out" | grep -c '^tcp:')" = 1 ] || fail "not exactly one DEVICE line"
  out=$(warpfs --list-devices tcp:127.0.0.1:4419 2>&1) && fail "discovery on a closed port succeeded"
  echo "  closed port: $out"
  echo "$out" | grep -q '127.0.0.1:4419' || fail "the message does not name 127.0.0.1:4419"
}

# Header and data digests (CRC32C, TCP §3.6.2.2), which nvmet agrees to: the data path tests
# (every transfer size, scattered pages, concurrent transfers) with both digests on.
do_digests() {
  requires export
  have nvme_tests || fail "nvme_tests not carried"
  WARPFS_NVME_TEST_DEVICE=$TARGET,ns=2,digest=both GTEST_COLOR=no GTEST_BRIEF=1 \
    nvme_tests --gtest_filter='DataPath.*:NamespaceIo.*:PhaseTag.*' ||
    fail "nvme_tests with WARPFS_NVME_TEST_DEVICE=$TARGET,ns=2,digest=both"
}

# fsck through a connection with both digests (every metadata block read with them).
do_fsck_digests() {
  requires mkfs
  fsck.warpfs -f -n "$DEVICE,digest=both" || fail "fsck.warpfs -f -n $DEVICE,digest=both"
}

# The subsystem's link under the port: removing it makes nvmet tear down the controllers of
# that subsystem on the port and stop listening (its last subsystem); linking it again
# listens again.
port_down() { rm "$PORT_DIR/subsystems/$NQN"; }
port_up() { ln -s "$SUBSYS_DIR" "$PORT_DIR/subsystems/$NQN"; }
listening() { netstat -ltn 2>/dev/null | grep -q '127.0.0.1:4420'; }

# pl_writer COUNT: files /mnt/pl/wN of 64 KiB to 1 MiB, each fsync'd; the sums of those whose
# fsync succeeded go to $state/pl.ok, the failures to $state/pl.err; a line in $state/pl.done
# when all were tried.
pl_writer() {
  i=0
  while [ "$i" -lt "$1" ]; do
    f=/mnt/pl/w$i
    src=$state/pl.src
    head -c $(((i % 16 + 1) * 65536)) /dev/urandom >"$src"
    if cp "$src" "$f" 2>>"$state/pl.err" && sync "$f" 2>>"$state/pl.err"; then
      echo "$(sha256sum <"$src" | cut -d' ' -f1)  w$i" >>"$state/pl.ok"
    else
      echo "w$i failed" >>"$state/pl.err"
    fi
    echo "$i" >"$state/pl.progress"
    i=$((i + 1))
  done
  echo finished >"$state/pl.done"
}
progress() { cat "$state/pl.progress" 2>/dev/null || echo -1; }
progress_at_least() { [ "$(progress)" -ge "$1" ]; }
writer_done() { [ -e "$state/pl.done" ]; }

# The port goes away in the middle of fsync'd writes and comes back 3 s later (OUTAGE_S;
# warpfs.outage_s=N on the kernel command line changes it): every call
# returns (EIO or success, never a hang: the step's time limit would catch one), then the
# daemon is unmounted and mounted again and every file whose fsync succeeded is there, byte
# for byte; fsck (its own step after this one) finds the filesystem clean.
do_port_loss() {
  is_mounted || fail "$MNT is not mounted"
  rm -f "$state"/pl.*
  mkdir /mnt/pl || fail "mkdir /mnt/pl"
  pl_writer 40 &
  writer=$!
  wait_until 60 "the writer made no progress before the outage" progress_at_least 3
  echo "  at file $(progress): the subsystem's link leaves the port"
  port_down || fail "removing the port's subsystem link"
  wait_until 10 "nvmet still listens after the link went" sh -c '! netstat -ltn | grep -q 127.0.0.1:4420'
  at=$(progress)
  sleep "$OUTAGE_S"  # the outage: writes go on meanwhile, against no target
  echo "  at file $(progress) (was $at when the port went): the link comes back"
  port_up || fail "linking the subsystem again"
  wait_until 10 "nvmet does not listen again" listening
  wait_until 120 "the writer hangs: no end 120 s after the port came back" writer_done
  wait "$writer"
  ok=$(wc -l <"$state/pl.ok" 2>/dev/null || echo 0)
  bad=$(grep -c 'failed$' "$state/pl.err" 2>/dev/null || echo 0)
  echo "  40 files: $ok fsync'd, $bad failed (EIO is allowed, a hang is not)"
  grep -v 'failed$' "$state/pl.err" 2>/dev/null | sort | uniq -c | head -5 | sed 's/^/  /'
  # Unmount whatever state the daemon is in; a daemon that gave up exits by itself.
  umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
  wait_until 120 "warpfs still running 120 s after umount" daemon_exited
  echo "  the daemon exited with status $(cat "$state/daemon.rc"); its last lines:"
  tail -n 5 "$state/daemon.log" | sed 's/^/  | /'
  do_mount
  (cd /mnt/pl && sha256sum -c "$state/pl.ok") >"$state/pl.check" 2>&1 || {
    grep -v ': OK$' "$state/pl.check" | head
    fail "a file whose fsync succeeded differs or is missing after the outage"
  }
  echo "  all $ok fsync'd files intact after remount"
  check_data
}

# ------------------------------------------------------------------------------------------
# The benchmark mode (bench/tcp-guest.sh boots the guest with warpfs.bench=1): random 4 KiB
# reads at 1 and 32 threads (warpfs-bench-blockread), each JSON line printed with the prefix
# WARPFS-BENCH for the host to collect.

bench_out() { sed -n 's/^{/WARPFS-BENCH {/p'; }

# bench_fs LABEL DEVICE MKFS_OPTIONS...: warpfs on DEVICE with no software cache (every read
# reaches the device), a 32 MiB file read with O_DIRECT.
bench_fs() {
  label=$1 dev=$2
  shift 2
  have warpfs-bench-blockread || fail "warpfs-bench-blockread not carried"
  mkfs.warpfs "$@" "$dev" >/dev/null || fail "mkfs.warpfs $dev"
  rm -f "$state/daemon.rc"
  (
    warpfs -f -o cache_mb=0 "$dev" "$MNT" >"$state/daemon.log" 2>&1
    echo $? >"$state/daemon.rc"
  ) </dev/null &
  wait_until 60 "no mount of $dev" is_mounted
  head -c 33554432 /dev/urandom >"$MNT/bench.dat" || fail "writing $MNT/bench.dat"
  sync
  warpfs-bench-blockread --target "$MNT/bench.dat" --label "$label" --seconds "$BENCH_S" \
    >"$state/bench.out"
  rc=$?
  bench_out <"$state/bench.out"
  umount "$MNT" || fail "umount $MNT"
  wait_until 60 "warpfs still running after umount" daemon_exited
  [ "$rc" = 0 ] || fail "warpfs-bench-blockread on $MNT/bench.dat: status $rc"
}
do_bench_warpfs_tcp() { bench_fs warpfs-tcp "$TARGET,ns=1"; }
do_bench_warpfs_emu() { bench_fs warpfs-emu emu:/tmp/emu.img --size 256M; }

# warpfs's driver straight on namespace 2 over NVMe/TCP (its first 32 MiB written first).
do_bench_driver_tcp() {
  dd if=/dev/urandom of=/dev/ram0 bs=1M count=32 2>/dev/null || fail "filling /dev/ram0"
  warpfs-bench-blockread --target "$TARGET,ns=2" --label driver-tcp --seconds "$BENCH_S" \
    >"$state/bench.out" || fail "warpfs-bench-blockread on $TARGET,ns=2"
  bench_out <"$state/bench.out"
}

# The kernel's initiator (nvme-tcp) on the same namespace, through its block device.
ns2_block() {
  for d in /sys/block/nvme*n*; do
    [ -e "$d/nsid" ] && [ "$(cat "$d/nsid")" = 2 ] && [ -b "/dev/${d##*/}" ] && echo "/dev/${d##*/}" && return 0
  done
  return 1
}
do_bench_kernel_tcp() {
  while read -r m; do
    [ -n "$m" ] || continue
    [ -e "/sys/module/$(echo "$m" | tr - _)" ] && continue
    insmod "/modules/later/$m.ko" || fail "insmod $m"
  done </modules/later/order
  echo "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN" >/dev/nvme-fabrics ||
    fail "connecting nvme-tcp through /dev/nvme-fabrics"
  wait_until 30 "no block device for namespace 2" ns2_block
  dev=$(ns2_block)
  echo "  the kernel's initiator: namespace 2 is $dev"
  warpfs-bench-blockread --target "$dev" --label kernel-tcp --seconds "$BENCH_S" \
    >"$state/bench.out"
  rc=$?
  bench_out <"$state/bench.out"
  for c in /sys/class/nvme/nvme*; do echo 1 >"$c/delete_controller"; done
  [ "$rc" = 0 ] || fail "warpfs-bench-blockread on $dev: status $rc"
}

bench_steps() {
  BENCH_S=5
  read -r cmdline </proc/cmdline
  for arg in $cmdline; do
    case $arg in warpfs.bench_s=*) BENCH_S=${arg#warpfs.bench_s=} ;; esac
  done
  export BENCH_S
  echo "WARPFS-BENCH-INFO {\"kernel\":\"$(uname -r)\",\"cpus\":$(nproc),\"seconds_per_point\":$BENCH_S}"
  step loopback do_loopback
  step export do_export
  step -t 300 bench-driver-tcp do_bench_driver_tcp
  step -t 300 bench-kernel-tcp do_bench_kernel_tcp
  step -t 300 bench-warpfs-tcp do_bench_warpfs_tcp
  step -t 300 bench-warpfs-emu do_bench_warpfs_emu
}

# ------------------------------------------------------------------------------------------

if [ "$1" = --run ]; then  # one step (guest-tests.sh's run_one_step)
  run_one_step "$@"
fi

OUTAGE_S=3
read -r cmdline </proc/cmdline
for arg in $cmdline; do
  case $arg in warpfs.outage_s=*) OUTAGE_S=${arg#warpfs.outage_s=} ;; esac
done
CONFIG=tcp
DEVICE=$TARGET,ns=1
DEVICE_NAME=$TARGET
TEST_DEVICE=$TARGET,ns=2
MKFS_OPTS=  # namespace 1 is fresh: the driver's tests ran on 2, so no --force
export CONFIG DEVICE DEVICE_NAME TEST_DEVICE MKFS_OPTS NQN PORT_DIR SUBSYS_DIR TARGET OUTAGE_S
rm -rf "$state"
mkdir -p "$state"

if grep -qw warpfs.bench=1 /proc/cmdline; then
  bench_steps
  exit 0
fi

step binaries do_binaries nvme_tests mkfs.warpfs fsck.warpfs warpfs warpfs-fsx
step loopback do_loopback
step export do_export
step discovery do_discovery
step -t 300 driver-tests do_tcp_driver_tests
step -t 120 digests do_digests
step mkfs do_mkfs
step mount do_mount
step -t 300 workload do_workload
step unmount do_unmount
step remount do_mount
step verify do_verify
step -t 240 port-loss do_port_loss
step unmount-2 do_unmount
step fsck do_fsck
step fsck-digests do_fsck_digests
