#!/usr/bin/env bash
# Integration scenarios on a real FUSE mount of warpfs, driven from separate processes.
#   usage: mounted.sh SCENARIO        (tests/CMakeLists.txt registers one ctest per scenario)
# The programs come from the environment: WARPFS, MKFS, FSCK, TUNE, DUMP, STAT, RESIZE, POSIX_TESTS, POSIX_PERSIST, FSX;
# MAN_WARPFS is warpfs(8), whose STATS FILE section the stats scenario checks the file against.
# Every scenario formats its own image in its own directory, and ends with fsck.warpfs -f of
# the unmounted image, which must find nothing.
set -uo pipefail
scenario=${1:?scenario}
work=$(mktemp -d "${TMPDIR:-/tmp}/warpfs-$scenario.XXXXXX")
chmod 755 "$work"  # the permission tests run as another user: it must reach the mount
img=$work/img
device="emu:$img"  # what mount_fs and fsck_clean open (a RAID set's list in the raid scenario)
mnt=$work/mnt
mkdir -p "$mnt"
daemon_pid=
uring_param=/sys/module/fuse/parameters/enable_uring
uring_was=  # the parameter's value before the uring scenario set it
disabled_was=  # kernel.io_uring_disabled before the uring scenario set it

fail() { echo "FAIL ($scenario): $*" >&2; exit 1; }
cleanup() {
  if mountpoint -q "$mnt"; then fusermount3 -u -z "$mnt" 2>/dev/null; fi
  [[ -n $daemon_pid ]] && kill -9 "$daemon_pid" 2>/dev/null
  [[ -n $uring_was ]] && echo "$uring_was" >"$uring_param"
  [[ -n $disabled_was ]] && echo "$disabled_was" >/proc/sys/kernel/io_uring_disabled
  rm -rf "$work"
}
trap cleanup EXIT

format() {  # format SIZE [mkfs options...]
  local size=$1
  shift
  "$MKFS" -q --size "$size" "$@" "emu:$img" || fail "mkfs.warpfs"
}
# Mounts in the foreground, in the background, so that the daemon's pid is known; returns
# once the mount is visible (the daemon exits if it fails, which ends the wait too).
mount_fs() {
  # (A background job of a script inherits SIGINT ignored; the daemon must see it.)
  env --default-signal=INT "$WARPFS" -f "$device" "$mnt" -o allow_other "$@" 2>"$work/daemon.log" &
  daemon_pid=$!
  for _ in $(seq 1 600); do
    mountpoint -q "$mnt" && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/daemon.log" >&2; fail "the daemon exited"; }
    sleep 0.05
  done
  fail "no mount after 30 s"
}
unmount_fs() {
  fusermount3 -u "$mnt" || fail "fusermount3 -u"
  wait "$daemon_pid" || { cat "$work/daemon.log" >&2; fail "the daemon exited with an error"; }
  daemon_pid=
}
# Whether a process holds the image's lock (an open-file-description write lock, which a
# POSIX record lock conflicts with; flock(1) would not see it).
image_locked() {
  python3 -c 'import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(0)
sys.exit(1)' "$img"
}
# hold_ofd_lock write|read: a background process (pid in $locker) takes an open-file-description
# lock of that kind on the image (on a descriptor open for writing or for reading, as warpfs
# and fsck.warpfs do) and holds it for 60 s; returns once the lock is held.
hold_ofd_lock() {
  rm -f "$work/held"
  mkfifo -m 600 "$work/held"
  python3 -c 'import fcntl, os, struct, sys, time
write = sys.argv[3] == "write"
fd = os.open(sys.argv[1], os.O_RDWR if write else os.O_RDONLY)
kind = fcntl.F_WRLCK if write else fcntl.F_RDLCK
fcntl.fcntl(fd, 37, struct.pack("hhqqi", kind, 0, 0, 0, 0))  # F_OFD_SETLK
open(sys.argv[2], "w").write("held\n")
time.sleep(60)' "$img" "$work/held" "$1" &
  locker=$!
  [[ $(cat "$work/held") == held ]] || fail "could not take a $1 OFD lock to test with"
}
# umount(8) returns before the daemon has written everything and let go of the image: wait
# for the lock (mkfs and fsck wait themselves; this is for the tests' own checks).
wait_released() {
  for _ in $(seq 1 600); do
    image_locked || return 0
    sleep 0.05
  done
  fail "the daemon did not let go of the image within 30 s"
}
# handles handle MNT NAME... prints "NAME TYPE HEX" lines (name_to_handle_at); handles open MNT
# FILE reads such lines and prints "NAME: first line of the file" or "NAME: ESTALE"
# (open_by_handle_at), all on one line.
handles() {
  python3 - "$@" <<'PY'
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class FH(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("data", ctypes.c_ubyte * 128)]
mode, mnt = sys.argv[1], sys.argv[2]
if mode == "handle":
    for name in sys.argv[3:]:
        h, mid = FH(bytes=128), ctypes.c_int()
        if libc.name_to_handle_at(-100, os.path.join(mnt, name).encode(), ctypes.byref(h), ctypes.byref(mid), 0):
            sys.exit("name_to_handle_at %s: %s" % (name, os.strerror(ctypes.get_errno())))
        print(name, h.type, bytes(h.data[:h.bytes]).hex())
else:
    mfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    out = []
    for line in open(sys.argv[3]):
        name, typ, hexdata = line.split()
        raw = bytes.fromhex(hexdata)
        h = FH(bytes=len(raw), type=int(typ))
        ctypes.memmove(h.data, raw, len(raw))
        fd = libc.open_by_handle_at(mfd, ctypes.byref(h), os.O_RDONLY)
        if fd < 0:
            e = ctypes.get_errno()
            out.append("%s: %s" % (name, "ESTALE" if e == errno.ESTALE else os.strerror(e)))
        else:
            out.append("%s: %s" % (name, os.read(fd, 100).decode().strip()))
            os.close(fd)
    print(" ".join(out))
PY
}
fsck_clean() {
  local out
  out=$("$FSCK" -f -n "$device" 2>&1) || { echo "$out" >&2; fail "fsck.warpfs -f -n found problems"; }
  echo "$out"
}

# A number from the live view (warpfs-stat --json): `stat_of shared.shared_blocks`.
stat_of() {
  "$STAT" --json "$mnt" | python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."): v = v.get(k, {}) if isinstance(v, dict) else {}
print(v if v != {} else "")' "$1"
}
used_kib() { df -k --output=used "$mnt" | tail -1 | tr -d ' '; }

case $scenario in
  share)  # cp clones (copy_file_range), copy-on-write, df, writers beside clones, -o dedup, fsck
    format 512M
    mount_fs
    head -c 64M /dev/urandom >"$work/src"
    cp "$work/src" "$mnt/a" && sync -f "$mnt/a" || fail "cp into the mount"
    u0=$(used_kib)
    cp "$mnt/a" "$mnt/b" && sync -f "$mnt/b" || fail "cp a b"
    u1=$(used_kib)
    cmp "$mnt/a" "$mnt/b" || fail "the clone differs"
    ((u1 - u0 < 1024)) || fail "cp of 64 MiB took $((u1 - u0)) KiB: not a clone"
    shared=$(stat_of shared.shared_blocks)
    ((shared >= 16384)) || fail "shared.shared_blocks is '$shared' after cloning 16384 blocks"
    # Writes into the clone copy its blocks: a stays as it was, b changes.
    dd if=/dev/urandom of="$mnt/b" bs=4k count=10 seek=100 conv=notrunc status=none
    python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b"xyz", 4096 * 7 + 5)' "$mnt/b"
    cmp "$work/src" "$mnt/a" || fail "a write into the clone reached the original"
    cmp -s "$mnt/a" "$mnt/b" && fail "the clone's writes are lost"
    # Unaligned and same-file ranges through copy_file_range(2).
    python3 -c 'import os, sys
s = os.open(sys.argv[1], os.O_RDONLY); d = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
assert os.copy_file_range(s, d, 1000000, 3, 0) == 1000000
assert os.copy_file_range(s, d, 8192, 0, 4096 * 300) == 8192
assert os.copy_file_range(d, d, 4096, 0, 4096 * 400) == 4096' "$mnt/a" "$mnt/c" || fail "copy_file_range(2)"
    python3 -c 'import sys
a = open(sys.argv[1], "rb").read(); c = open(sys.argv[2], "rb").read()
want = bytearray(4096 * 401); want[0:1000000] = a[3:1000003]; want[4096 * 300:4096 * 302] = a[0:8192]
want[4096 * 400:4096 * 401] = want[0:4096]
sys.exit(0 if c == bytes(want) else 1)' "$mnt/a" "$mnt/c" || fail "copy_file_range(2) copied the wrong bytes"
    # Four processes clone a while a fifth rewrites it, 1 MiB per write(2): each MiB of each
    # clone is that MiB of one version of a (a clone and a write exclude each other).
    for v in 1 2 3; do head -c 64M /dev/urandom >"$work/v$v"; done
    pids=()
    for i in 1 2 3 4; do
      (for k in 1 2 3 4 5; do cp "$mnt/a" "$mnt/c$i.$k" || exit 1; done) &
      pids+=($!)
    done
    (for v in 1 2 3; do dd if="$work/v$v" of="$mnt/a" bs=1M conv=notrunc status=none; done) &
    pids+=($!)
    for p in "${pids[@]}"; do wait "$p" || fail "cp beside a writer"; done
    python3 -c 'import sys
w = sys.argv[1]; versions = [open(f"{w}/{n}", "rb").read() for n in ("src", "v1", "v2", "v3")]
M = 1 << 20
for i in range(1, 5):
    for k in range(1, 6):
        c = open(f"{sys.argv[2]}/c{i}.{k}", "rb").read()
        assert len(c) == 64 * M, (i, k, len(c))
        for m in range(64):
            assert any(c[m * M:(m + 1) * M] == v[m * M:(m + 1) * M] for v in versions), (i, k, m)
' "$work" "$mnt" || fail "a clone beside the writer holds a MiB of no version"
    cmp "$work/v3" "$mnt/a" || fail "a is not its last version"
    unmount_fs
    fsck_clean >/dev/null
    # -o dedup: 24 files of 4 contents; the pass shares 20 files' blocks.
    mount_fs
    mkdir "$mnt/dup"
    for k in 0 1 2 3; do head -c 1M /dev/urandom >"$work/d$k"; done
    for i in $(seq 0 23); do cp --reflink=never "$work/d$((i % 4))" "$mnt/dup/f$i"; done
    unmount_fs
    mount_fs -o dedup
    for _ in $(seq 600); do
      state=$(stat_of dedup.state)
      [[ $state == running || $state == off ]] || break
      sleep 0.05
    done
    [[ $state == "done" ]] || fail "dedup ended '$state'"
    shared=$(stat_of dedup.blocks_shared)
    ((shared >= 20 * 256)) || fail "dedup shared $shared blocks, expected at least $((20 * 256))"
    for i in $(seq 0 23); do cmp "$work/d$((i % 4))" "$mnt/dup/f$i" || fail "dedup changed f$i"; done
    unmount_fs
    fsck_clean >/dev/null
    ;;
  raid)  # RAID 1, then RAID 0, of two images: fsx beside four writer processes, remount, sums, fsck
    for level in 1 0; do
      a=$work/r$level-a.img b=$work/r$level-b.img
      device="emu:$a,emu:$b"
      "$MKFS" -q --raid "$level" --size 256M "$a" "$b" || fail "mkfs.warpfs --raid $level"
      mount_fs -o stats="$work/raid$level.json"
      "$FSX" -q -N 20000 -S "$((level + 1))" "$mnt/fsx" &
      fsx_pid=$!
      writers=()
      for p in 1 2 3 4; do
        (dd if=/dev/urandom of="$mnt/w$p" bs=64K count=48 status=none && sync "$mnt/w$p") &
        writers+=($!)
      done
      for w in "${writers[@]}"; do wait "$w" || fail "a writer over RAID $level"; done
      wait "$fsx_pid" || fail "fsx over RAID $level"
      md5sum "$mnt"/w* >"$work/sums" || fail "md5sum"
      unmount_fs
      # The stats file has the raid object warpfs(8) documents, every key of it.
      python3 - "$work/raid$level.json" "$MAN_WARPFS" "$level" <<'PY' || fail "the raid stats of RAID $level"
import json, re, sys
raid = json.load(open(sys.argv[1]))["raid"]
man = open(sys.argv[2]).read().split(".SH STATS FILE", 1)[1].split(".SH ", 1)[0]
doc = set(re.findall(r"^\.BR? raid\.([a-z_]+)", man, re.M))
assert doc and set(raid) == doc, (sorted(raid), sorted(doc))
assert raid["level"] == int(sys.argv[3]) and raid["members"] == 2 and not raid["degraded"], raid
PY
      fsck_clean >/dev/null
      "$FSCK" -f -n "emu:$b,emu:$a" >/dev/null 2>&1 && fail "fsck accepted the members in the wrong order"
      mount_fs
      md5sum -c --quiet "$work/sums" || fail "data changed across the remount of RAID $level"
      unmount_fs
      fsck_clean >/dev/null
    done
    ;;
  posix)  # the POSIX suite, one file per syscall family, with warpfs' own expectations
    format 2G --inodes 300000
    mount_fs
    WARPFS_TEST_DIR=$mnt WARPFS_TEST_FS=warpfs "$POSIX_TESTS" || fail "posix_tests"
    unmount_fs
    fsck_clean
    ;;
  wbcache)  # -o writeback_cache: the POSIX suite and fsx, and a full disk's ENOSPC at fsync
    # What the kernel's writeback cache cannot keep exact (warpfs(8), WRITEBACK CACHE):
    # space taken (statfs, st_blocks) and EFBIG at write(2), not at write-back.
    breaks=PageCacheTest.StatfsCountsWritesNotWrittenBack:StatTest.BlocksCoverWrittenDataAndEmptyFilesHaveNone
    breaks+=:IoTest.PunchHoleZeroesTheRangeAndFreesItsBlocks:IoTest.WarpfsRefusesWritesPastSixteenTiB
    format 2G --inodes 300000
    mount_fs -o writeback_cache
    WARPFS_TEST_DIR=$mnt WARPFS_TEST_FS=warpfs "$POSIX_TESTS" --gtest_filter="-$breaks" || fail "posix_tests"
    "$FSX" -q -N 100000 -S 1 "$mnt/fsx.small" || fail "fsx (1 MiB files)"
    "$FSX" -q -N 20000 -S 2 -l 64M -o 1M "$mnt/fsx.big" || fail "fsx (64 MiB files)"
    unmount_fs
    fsck_clean
    # A full disk: write(2) into the page cache succeeds, the write-back fails, and fsync
    # says so (the data that did not fit is lost, as fsync's error tells). (mkfs keeps the
    # size of an image file larger than --size: a new one.)
    rm -f "$img"
    format 64M
    mount_fs -o writeback_cache
    dd if=/dev/zero of="$mnt/fill" bs=1M count=100 conv=fsync status=none 2>"$work/dd.err" \
      && fail "dd did not fail on a full disk"
    grep -q "No space left" "$work/dd.err" || fail "dd failed with something else: $(cat "$work/dd.err")"
    rm -f "$mnt/fill"
    echo ok >"$mnt/after" || fail "cannot write after freeing space"
    unmount_fs
    fsck_clean
    ;;
  fsx)  # 100,000 random operations checked against a model, then 2 x 20,000 on big files
    format 1G
    mount_fs
    "$FSX" -q -N 100000 -S 1 "$mnt/fsx.small" || fail "fsx (1 MiB files)"
    "$FSX" -q -N 20000 -S 2 -l 64M -o 1M "$mnt/fsx.big" || fail "fsx (64 MiB files)"
    # The emulated device at no latency answers at once: the workers share one descriptor.
    [[ $(stat_of transport.worker_descriptors) == 0 ]] || fail "a prompt device, yet workers with descriptors of their own"
    unmount_fs
    fsck_clean
    # Reads answered by the daemon's reapers (-o async_reads=2; no software cache, and the
    # controller's own threads run every command 20 µs late: a read is still in flight when its
    # handler returns): two fsx processes at once, and reads counted as answered later.
    mount_fs -o async_reads=2,inline_io=0,cache_mb=0,latency_us=20
    "$FSX" -q -N 25000 -S 3 "$mnt/fsx.async1" &
    p1=$!
    "$FSX" -q -N 25000 -S 4 "$mnt/fsx.async2" || fail "fsx (async_reads, second)"
    wait "$p1" || fail "fsx (async_reads, first)"
    later=$(stat_of transport.reads_answered_later)
    echo "async_reads=2: $later reads answered later" >&2
    ((later > 1000)) || fail "async_reads=2: $later reads answered later"
    # A device with latency: each worker reads a descriptor of its own (the default there), so
    # the reapers' answers above went to the descriptors their requests came from.
    fds=$(stat_of transport.worker_descriptors)
    ((fds >= 1)) || fail "latency_us=20: $fds workers with a descriptor of their own"
    unmount_fs
    fsck_clean
    ;;
  fds)  # -o shared_fd=0 (a /dev/fuse descriptor each worker) at no latency: the POSIX suite, two fsx at once
    # Beside the fsx runs, 1 MiB O_DIRECT writes (transfers past the software cache, straight
    # between the FUSE buffer and the device), then read back the same way.
    format 2G --inodes 300000
    mount_fs -o shared_fd=0
    WARPFS_TEST_DIR=$mnt WARPFS_TEST_FS=warpfs "$POSIX_TESTS" || fail "posix_tests (shared_fd=0)"
    head -c 24M /dev/urandom >"$work/stream"
    # FDS_FSX_OPS: each fsx's operations (the TSan daemon's run takes fewer: tests/CMakeLists.txt)
    "$FSX" -q -N "${FDS_FSX_OPS:-20000}" -S 5 "$mnt/fsx.fds1" &
    p1=$!
    dd if="$work/stream" of="$mnt/stream" bs=1M oflag=direct status=none &
    p2=$!
    "$FSX" -q -N "${FDS_FSX_OPS:-20000}" -S 6 "$mnt/fsx.fds2" || fail "fsx (shared_fd=0, second)"
    wait "$p1" || fail "fsx (shared_fd=0, first)"
    wait "$p2" || fail "dd of 24 MiB in 1 MiB O_DIRECT writes"
    dd if="$mnt/stream" bs=1M iflag=direct status=none | cmp - "$work/stream" ||
      fail "24 MiB written and read in 1 MiB O_DIRECT transfers differ"
    fds=$(stat_of transport.worker_descriptors)
    # The daemon holds the session's descriptor and one for each of those workers.
    open=$(find "/proc/$daemon_pid/fd" -lname /dev/fuse 2>/dev/null | wc -l)
    rerouted=$(stat_of transport.replies_rerouted)
    echo "shared_fd=0: $fds workers with a descriptor of their own, $open open, $rerouted replies rerouted" >&2
    ((fds >= 2 && open == fds + 1)) || fail "shared_fd=0: $fds workers' descriptors, $open /dev/fuse open"
    # Every reply found its descriptor in the table at once (none of these requests waits
    # while thousands of later ones pass): a table that routed wrongly would show here, its
    # replies then reaching their descriptors only by the fallback's search.
    [[ $rerouted == 0 ]] || fail "shared_fd=0: $rerouted replies went to the wrong descriptor first"
    unmount_fs
    fsck_clean
    ;;
  persist)  # everything survives unmount/remount: contents, modes, owners, times, xattrs, links
    format 512M
    mount_fs
    "$POSIX_PERSIST" populate "$mnt/tree" || fail "populate"
    # File handles outlive the mount (what an NFS export needs): taken now, opened after a
    # remount; the handle of a file deleted meanwhile is stale.
    echo "kept" >"$mnt/handled"
    echo "gone" >"$mnt/deleted"
    handles handle "$mnt" handled deleted >"$work/handles" || fail "name_to_handle_at"
    rm "$mnt/deleted"
    unmount_fs
    fsck_clean
    mount_fs
    "$POSIX_PERSIST" verify "$mnt/tree" || fail "verify after remount"
    out=$(handles open "$mnt" "$work/handles") || fail "open_by_handle_at after a remount: $out"
    [[ $out == "handled: kept deleted: ESTALE" ]] || fail "handles after a remount: $out"
    unmount_fs
    ;;
  kill9)  # kill -9 after fsync: the fsync'd data is there after remount, and fsck is clean
    format 512M
    mount_fs
    head -c $((24 << 20)) /dev/urandom >"$work/ref"
    dd if="$work/ref" of="$mnt/synced" bs=1M conv=fsync status=none || fail "dd"
    mkdir -p "$mnt/dir"
    for i in $(seq 1 200); do echo "$i" >"$mnt/dir/f$i"; done
    sync "$mnt/dir" || fail "fsync of the directory"
    # More work in flight, not synced, when the daemon dies.
    dd if=/dev/urandom of="$mnt/unsynced" bs=1M count=8 status=none
    kill -9 "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=
    fusermount3 -u -z "$mnt"
    "$FSCK" -n "emu:$img" || fail "fsck -n right after the crash reports damage"
    mount_fs
    cmp "$work/ref" "$mnt/synced" || fail "fsync'd data differs after the crash"
    [[ $(ls "$mnt/dir" | wc -l) -eq 200 ]] || fail "synced directory lost entries"
    [[ $(cat "$mnt/dir/f117") == 117 ]] || fail "synced small file differs"
    unmount_fs
    fsck_clean
    ;;
  signals)  # SIGTERM / SIGINT unmount and leave the superblock clean; -o ro refuses writes
    format 256M
    for sig in TERM INT; do
      mount_fs
      echo data >"$mnt/f-$sig" || fail "write"
      kill -s "$sig" "$daemon_pid"
      wait "$daemon_pid" || fail "the daemon failed on SIG$sig"
      daemon_pid=
      mountpoint -q "$mnt" && fail "still mounted after SIG$sig"
      # Without -f, fsck skips a clean filesystem: it says "clean".
      "$FSCK" -n "emu:$img" | grep -q clean || fail "superblock not clean after SIG$sig"
    done
    sum0=$(md5sum <"$img")
    mount_fs -o ro
    [[ $(cat "$mnt/f-TERM") == data ]] || fail "data lost"
    touch "$mnt/new" 2>/dev/null && fail "a read-only mount accepted a create"
    echo more >>"$mnt/f-TERM" 2>/dev/null && fail "a read-only mount accepted a write"
    unmount_fs
    [[ $(md5sum <"$img") == "$sum0" ]] || fail "a read-only mount changed the image"
    fsck_clean
    ;;
  enospc)  # a full disk: ENOSPC, nothing damaged, and the space comes back
    format 64M
    mount_fs
    free0=$(stat -f -c %f "$mnt")
    dd if=/dev/zero of="$mnt/fill" bs=1M status=none 2>"$work/dd.err" && fail "dd did not fail on a full disk"
    grep -q "No space left" "$work/dd.err" || fail "dd failed with something else: $(cat "$work/dd.err")"
    touch "$mnt/small" || true
    rm -f "$mnt/fill" "$mnt/small"
    # The kernel sends the unlinked inodes' FORGET asynchronously: wait for the count.
    for _ in $(seq 1 200); do
      sync "$mnt"
      free1=$(stat -f -c %f "$mnt")
      [[ $free1 -eq $free0 ]] && break
      sleep 0.05
    done
    [[ $free1 -eq $free0 ]] || fail "free blocks $free1 after delete, $free0 before"
    echo ok >"$mnt/after" || fail "cannot write after freeing space"
    # Space freed by rm is there for the very next allocation (no wait, no sync): most of the
    # disk, freed and taken again 20 times, by fallocate and by dd.
    most=$(( $(stat -f -c %a "$mnt") * 4 * 3 / 4 ))K
    for i in $(seq 1 20); do
      fallocate -l "$most" "$mnt/big" || fail "fallocate $most right after rm (round $i)"
      rm "$mnt/big"
      dd if=/dev/zero of="$mnt/big" bs=1M count=$(( ${most%K} / 1024 )) status=none \
        || fail "dd of $most right after rm (round $i)"
      rm "$mnt/big"
    done
    # Asynchronous O_DIRECT writes (libaio) filling the disk: the kernel turns a short reply
    # to one into EIO, so the write that runs out of room must come back ENOSPC. No
    # fallocate first (fio's default would take the room before any write), and bytes that
    # cannot be mistaken for a hole's zeroes.
    if command -v fio >/dev/null; then
      fio --name=afill --filename="$mnt/afill" --size=128m --bs=1m --rw=write --direct=1 \
        --ioengine=libaio --iodepth=4 --fallocate=none --buffer_pattern=0x5a \
        >"$work/fio.out" 2>&1 && fail "fio did not fail on a full disk"
      grep -q "io_u error.*No space left" "$work/fio.out" ||
        fail "fio's write failed with something else: $(grep -i err "$work/fio.out")"
      grep -q "Input/output error" "$work/fio.out" && fail "a full disk said EIO: $(grep -i err "$work/fio.out")"
      size=$(stat -c %s "$mnt/afill")
      ((size > 0 && size % 1048576 == 0)) ||
        fail "afill is $size bytes: the failed write left part of itself past the end"
      cmp <(tr '\0' '\132' </dev/zero | head -c "$size") "$mnt/afill" ||
        fail "afill does not read back as written"
      rm "$mnt/afill"
    fi
    unmount_fs
    fsck_clean
    # Blocks kept for root (mkfs -m): several of nobody's writers at once stop short of them,
    # df shows nothing available, and root still writes.
    format 64M --force -m 20
    mount_fs
    mkdir -m 1777 "$mnt/tmp"
    pids=()
    for i in 1 2 3; do
      su nobody -s /bin/sh -c "exec dd if=/dev/zero of=$mnt/tmp/fill$i bs=64K status=none" 2>"$work/dd$i.err" &
      pids+=($!)
    done
    wait "${pids[@]}"
    for i in 1 2 3; do
      grep -q "No space left" "$work/dd$i.err" || fail "nobody's dd $i: $(cat "$work/dd$i.err")"
    done
    [[ $(stat -f -c %a "$mnt") -eq 0 ]] || fail "df shows $(stat -f -c %a "$mnt") blocks available after nobody filled it"
    kept=$(( $(stat -f -c %b "$mnt") / 5 ))
    [[ $(stat -f -c %f "$mnt") -ge $kept ]] || fail "nobody took blocks kept for root: $(stat -f -c %f "$mnt") free, $kept kept"
    su nobody -s /bin/sh -c "head -c 65536 /dev/zero >$mnt/tmp/more" 2>/dev/null && fail "nobody wrote into the blocks kept for root"
    mib=$(( kept * 4 / 1024 / 2 ))
    dd if=/dev/zero of="$mnt/root" bs=1M count=$mib status=none || fail "root could not write $mib MiB into its reserve"
    [[ $(stat -c %s "$mnt/root") -eq $(( mib << 20 )) ]] || fail "root's file has $(stat -c %s "$mnt/root") bytes"
    unmount_fs
    fsck_clean
    ;;
  release)  # unmount, then at once fsck, mkfs or a new mount: they wait for the daemon to let go
    format 512M
    [[ $(stat -c %a "$img") == 600 ]] || fail "mkfs made the image mode $(stat -c %a "$img"), not 600"
    for round in 1 2 3 4 5; do
      "$WARPFS" "emu:$img" "$mnt" || fail "mount (round $round)"
      dd if=/dev/urandom of="$mnt/big" bs=1M count=32 status=none || fail "write"
      for f in $(seq 1 300); do echo "$f" >"$mnt/f$f"; done
      out=$("$FSCK" -f -n "emu:$img" 2>&1) && fail "fsck of a mounted image was not refused"
      grep -q "mounted on $mnt" <<<"$out" || fail "fsck's refusal does not name the mount: $out"
      fusermount3 -u "$mnt" || fail "fusermount3 -u"
      case $round in  # right after the unmount returned, with the daemon likely still busy
        1|2|3) fsck_clean >/dev/null ;;
        4) "$MKFS" -q --force "emu:$img" || fail "mkfs right after the unmount" ;;
        5) "$WARPFS" "emu:$img" "$mnt" || fail "mount right after the unmount"
           fusermount3 -u "$mnt" ;;
      esac
    done
    wait_released
    # A user who may read the image cannot block it: whatever lock nobody takes on a
    # read-only descriptor (flock, which used to be the image lock, or a read lock), fsck
    # and a mount still get theirs.
    chmod 644 "$img"
    mkfifo -m 666 "$work/held"
    su nobody -s /bin/sh -c "exec flock -x -n $img sh -c 'echo held >$work/held; exec sleep 60'" &
    locker=$!
    [[ $(cat "$work/held") == held ]] || fail "nobody could not take a flock to test with"
    # ... and the image's mode is named: others can read every file's data in it.
    out=$(fsck_clean) || exit 1
    grep -q "has mode 0644" <<<"$out" || fail "fsck does not warn of a 0644 image: $out"
    mount_fs
    echo ok >"$mnt/after" || fail "write beside nobody's lock"
    unmount_fs
    grep -q "has mode 0644" "$work/daemon.log" || fail "the daemon does not warn of a 0644 image"
    kill "$locker" 2>/dev/null
    chmod 600 "$img"
    # A writer's lock does block, and the refusal (after the bounded wait) names its holder.
    hold_ofd_lock write
    out=$("$FSCK" -f -n "emu:$img" 2>&1) && fail "fsck beside a writer's lock was not refused"
    grep -q "held by pid $locker (python3)" <<<"$out" || fail "the refusal does not name the holder: $out"
    kill "$locker" 2>/dev/null
    wait "$locker" 2>/dev/null
    # A check without -y writes nothing and takes a read lock: beside another reader's read
    # lock, two at once both run (a write lock would have waited, then been refused).
    hold_ofd_lock read
    "$FSCK" -f -n "emu:$img" >"$work/fsck1.log" 2>&1 &
    other=$!
    out=$(fsck_clean) || exit 1
    grep -q "has mode" <<<"$out" && fail "fsck warns of a 0600 image: $out"
    wait "$other" || { cat "$work/fsck1.log" >&2; fail "a second fsck -n beside a reader failed"; }
    grep -q "waiting" "$work/fsck1.log" && fail "fsck -n waited for a reader: $(cat "$work/fsck1.log")"
    kill "$locker" 2>/dev/null
    wait "$locker" 2>/dev/null
    ;;
  privileged)  # nosuid,nodev unless asked: a setuid-root program or a device node gives nothing
    # libfuse mounts nosuid,nodev by default; `-o suid,dev` opts out (README, Security). The
    # same files with the opt-out show that the checks can tell.
    format 64M
    for opts in default suid,dev; do
      if [[ $opts == default ]]; then mount_fs; else mount_fs -o "$opts"; fi
      flags=$(awk -v m="$mnt" '$2 == m { print $4 }' /proc/mounts)
      cp "$(command -v id)" "$mnt/rootid" && chown root:root "$mnt/rootid" && chmod 4755 "$mnt/rootid" \
        || fail "a setuid copy of id"
      mknod -m 666 "$mnt/null" c 1 3 || fail "mknod"
      euid=$(su nobody -s /bin/sh -c "$mnt/rootid -u") || fail "nobody could not run $mnt/rootid"
      if su nobody -s /bin/sh -c "echo x >$mnt/null" 2>/dev/null; then dev=opens; else dev=refused; fi
      if [[ $opts == default ]]; then
        [[ ,$flags, == *,nosuid,* && ,$flags, == *,nodev,* ]] || fail "mounted with $flags, not nosuid,nodev"
        [[ $euid != 0 ]] || fail "a setuid-root program on the mount ran as root"
        [[ $dev == refused ]] || fail "a device node on the mount opened"
      else
        [[ $euid == 0 ]] || fail "-o suid: the setuid bit was ignored (euid $euid)"
        [[ $dev == opens ]] || fail "-o dev: the device node was refused"
        # nobody empties a setuid-root program it may write (an O_TRUNC open, no write) and
        # root puts a program back (its write drops nothing: the bits are gone on the image
        # already): the kernel must not go on showing the bits the open dropped, and an exec
        # by nobody must not run as root.
        cp "$(command -v id)" "$mnt/mine" && chmod 6777 "$mnt/mine" && "$mnt/mine" -u >/dev/null ||
          fail "setup of mine"
        su nobody -s /bin/sh -c ": >$mnt/mine" || fail "nobody's O_TRUNC open of mine"
        cat "$(command -v id)" >>"$mnt/mine" || fail "root's append to mine"
        euid=$(su nobody -s /bin/sh -c "$mnt/mine -u") || fail "nobody could not run mine"
        [[ $euid != 0 ]] || fail "a program nobody emptied through O_TRUNC ran as root"
        # chown(f, -1, -1) clears set-user-ID too (chown_common, as on ext4).
        chmod 4755 "$mnt/mine" &&
          python3 -c 'import os, sys; os.chown(sys.argv[1], -1, -1)' "$mnt/mine" || fail "chown -1 -1"
        [[ $(stat -c %a "$mnt/mine") == 755 ]] || fail "chown(-1, -1) left mode $(stat -c %a "$mnt/mine")"
        rm -f "$mnt/mine"
      fi
      rm -f "$mnt/rootid" "$mnt/null"
      unmount_fs
      # A normal mount prints nothing (libfuse warned of its thread limits at every one).
      if [[ $opts == default && -s $work/daemon.log ]]; then
        fail "a normal mount printed: $(cat "$work/daemon.log")"
      fi
    done
    # A writer without CAP_FSETID clears set-user-ID and set-group-ID (group-executable) on
    # every path that changes contents, as Linux's file_remove_privs() does: nobody changes
    # root's 6777 files each way; the mode the kernel shows at once and the one on the image
    # must both have lost the bits (an O_DIRECT write left the kernel's cached mode stale).
    mount_fs
    echo "source of the copy" >"$mnt/src"
    paths="write direct alloc punch zero trunc copy"
    for how in $paths; do
      f=$mnt/$how
      head -c 65536 /dev/urandom >"$f" && chmod 6777 "$f" && stat -c %a "$f" >/dev/null || fail "setup $how"
      case $how in
        write)  cmd="echo x >>$f" ;;
        direct) cmd="dd if=/dev/zero of=$f bs=4096 count=1 oflag=direct conv=notrunc status=none" ;;
        alloc)  cmd="fallocate -l 131072 $f" ;;
        punch)  cmd="fallocate -p -o 0 -l 4096 $f" ;;
        zero)   cmd="fallocate -z -o 4096 -l 4096 $f" ;;
        trunc)  cmd="truncate -s 100 $f" ;;
        copy)   cmd="python3 -c 'import os; s = os.open(\"$mnt/src\", os.O_RDONLY); d = os.open(\"$f\", os.O_WRONLY); os.copy_file_range(s, d, 4, 0, 0)'" ;;
      esac
      su nobody -s /bin/sh -c "$cmd" || fail "nobody's $how"
      [[ $(stat -c %a "$f") == 777 ]] || fail "$how by nobody left mode $(stat -c %a "$f") (the kernel's view)"
    done
    unmount_fs
    mount_fs
    for how in $paths; do
      [[ $(stat -c %a "$mnt/$how") == 777 ]] || fail "$how by nobody left mode $(stat -c %a "$mnt/$how") on the image"
    done
    unmount_fs
    fsck_clean >/dev/null
    ;;
  stats)  # the daemon writes its stats file as root: never through a user's symlink
    format 64M
    echo secret >"$work/victim"
    chmod 600 "$work/victim"
    mkdir -m 1777 "$work/pub"      # like /var/tmp
    mkdir -m 0777 "$work/open"     # writable by all, not sticky
    mkdir -m 0700 "$work/priv"
    # A symlink a user planted where the stats go: the mount is refused, nothing written.
    su nobody -s /bin/sh -c "ln -s $work/victim $work/pub/stats.json" || fail "nobody's symlink"
    out=$("$WARPFS" "emu:$img" "$mnt" -o stats="$work/pub/stats.json" 2>&1) && fail "mounted with a symlinked stats file"
    grep -q "symlink" <<<"$out" || fail "the refusal does not name the symlink: $out"
    out=$("$WARPFS" "emu:$img" "$mnt" -o stats="$work/open/stats.json" 2>&1) && fail "mounted with stats in a non-sticky world-writable directory"
    # Planted after the mount: the dump at unmount refuses it.
    rm -f "$work/pub/stats.json"
    mount_fs -o stats="$work/pub/stats.json"
    su nobody -s /bin/sh -c "ln -s $work/victim $work/pub/stats.json" || fail "nobody's second symlink"
    unmount_fs
    [[ $(cat "$work/victim") == secret ]] || fail "the daemon wrote through the symlink"
    grep -q "stats not written" "$work/daemon.log" || fail "the daemon did not say it refused"
    # Where it may: a new file of root's, 0600, with the counters.
    mount_fs -o stats="$work/priv/stats.json"
    unmount_fs
    [[ $(stat -c %a "$work/priv/stats.json") == 600 ]] || fail "stats file mode $(stat -c %a "$work/priv/stats.json")"
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))["fs"]["commits"]' "$work/priv/stats.json" \
      || fail "the stats file is not the JSON it should be"
    # Its keys are the ones warpfs(8) documents (VFIO-only keys aside), no more, no fewer.
    python3 - "$work/priv/stats.json" "$MAN_WARPFS" <<'PY' || fail "the stats file and warpfs(8) STATS FILE differ"
import json, re, sys
def paths(o, pre=""):
    for k, v in o.items():
        p = pre + k
        if isinstance(v, dict):
            yield from paths(v, p + ".")
        else:
            yield p
got = set(re.sub(r"^commands\.[a-z]+\.", "commands.CLASS.", re.sub(r"^ops\.[a-z_]+\.", "ops.OP.", p))
          for p in paths(json.load(open(sys.argv[1]))))
man = open(sys.argv[2]).read()
section = man.split(".SH STATS FILE", 1)[1].split(".SH ", 1)[0]
doc = set(re.findall(r"^\.BR? ([a-z_]+\.[A-Za-z0-9_.]*[a-z0-9_])", section, re.M))
vfio_only = {"device." + k for k in ("iommu_group", "interrupts", "dma_bytes", "dma_mappings", "hugepage_bytes")}
vfio_only |= {p for p in doc if p.startswith("raid.")}  # RAID sets only: the raid scenario checks them
if got != doc - vfio_only:
    print("in the file, not documented:", sorted(got - doc), file=sys.stderr)
    print("documented, not in the file:", sorted(doc - vfio_only - got), file=sys.stderr)
    sys.exit(1)
PY
    fsck_clean >/dev/null
    ;;
  mounthelper)  # mount -t fuse.warpfs and an fstab line go through mount.fuse3 to warpfs
    format 128M
    # mount(8) runs helpers with a fixed PATH: warpfs must be installed (cmake --install puts
    # it in /usr/local/sbin). Link the build's binary there unless one is installed.
    link=
    if ! command -v /usr/local/sbin/warpfs >/dev/null; then
      ln -s "$WARPFS" /usr/local/sbin/warpfs && link=/usr/local/sbin/warpfs
      trap 'cleanup; [[ -n $link ]] && rm -f "$link"' EXIT
    fi
    mount -t fuse.warpfs "emu:$img" "$mnt" || fail "mount -t fuse.warpfs"
    echo hi >"$mnt/x" || fail "write through the helper mount"
    umount "$mnt" || fail "umount"
    wait_released
    printf 'emu:%s %s fuse.warpfs defaults,allow_other 0 0\n' "$img" "$mnt" >"$work/fstab"
    mount -T "$work/fstab" "$mnt" || fail "mount from an fstab line"
    [[ $(cat "$mnt/x") == hi ]] || fail "data through the fstab mount"
    umount "$mnt" || fail "umount"
    wait_released
    "$FSCK" -n "emu:$img" | grep -q clean || fail "not clean after umount"
    fsck_clean
    # mount -o remount,ro|rw: mount(8) runs the helper, which remounts; the daemon follows.
    mount_fs
    echo before >"$mnt/r" || fail "write"
    mount -o remount,ro "$mnt" || fail "mount -o remount,ro"
    echo no >"$mnt/r2" 2>/dev/null && fail "a write after remount,ro"
    [[ $(findmnt -no OPTIONS "$mnt" | cut -d, -f1) == ro ]] || fail "not read-only after remount,ro"
    for _ in $(seq 1 500); do grep -q "remounted read-only" "$work/daemon.log" && break; sleep 0.02; done
    grep -q "remounted read-only: the image is clean" "$work/daemon.log" || fail "the daemon did not follow remount,ro: $(cat "$work/daemon.log")"
    # Clean as after an unmount: a kill -9 now loses nothing and leaves nothing to replay.
    kill -9 "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=
    fusermount3 -u -z "$mnt"
    wait_released
    "$FSCK" -n "emu:$img" | grep -q clean || fail "not clean after remount,ro and kill -9"
    fsck_clean >/dev/null
    mount_fs
    [[ $(cat "$mnt/r") == before ]] || fail "data written before remount,ro lost"
    mount -o remount,ro "$mnt" || fail "mount -o remount,ro (again)"
    (echo no >>"$mnt/r") 2>/dev/null && fail "appended on a read-only remount"
    mount -o remount,rw "$mnt" || fail "mount -o remount,rw"
    for _ in $(seq 1 500); do grep -q "remounted read-write" "$work/daemon.log" && break; sleep 0.02; done
    grep -q "remounted read-write" "$work/daemon.log" || fail "the daemon did not follow remount,rw"
    echo after >"$mnt/r" || fail "write after remount,rw"
    exec 7>"$mnt/held"
    out=$(mount -o remount,ro "$mnt" 2>&1) && fail "remount,ro beside a file open for writing"
    exec 7>&-
    unmount_fs
    fsck_clean >/dev/null
    mount_fs
    [[ $(cat "$mnt/r") == after ]] || fail "the write after remount,rw is gone"
    unmount_fs
    fsck_clean
    ;;
  live)  # warpfs-stat: a running daemon's counters over its root-only socket, beside work; parallel direct writers and readers
    format 256M
    mount_fs
    sock=/run/warpfs/$(stat -c '%Hd:%Ld' "$mnt").sock
    [[ -S $sock ]] || fail "no live-view socket at $sock"
    [[ $(stat -c '%a %U' "$sock") == "600 root" ]] || fail "live-view socket: $(stat -c '%a %U' "$sock")"
    [[ $(stat -c '%a %U' /run/warpfs) == "700 root" ]] || fail "/run/warpfs: $(stat -c '%a %U' /run/warpfs)"
    pids=()
    for i in 1 2 3; do
      (dd if=/dev/zero of="$mnt/f$i" bs=64K count=200 status=none && cat "$mnt/f$i" >/dev/null) &
      pids+=($!)
    done
    for i in 1 2 3; do
      "$STAT" --json --watch=0.05 --count 10 "$mnt" >"$work/w$i.jsonl" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a writer or a watcher failed"; done
    # fsync: the software cache writes the files back and the device flushes.
    for i in 1 2 3; do
      python3 -c 'import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))' "$mnt/f$i" || fail "fsync f$i"
    done
    "$STAT" --json "$mnt" >"$work/now.json" || fail "warpfs-stat --json"
    python3 - "$work" <<'PY' || fail "warpfs-stat: counters"
import json, sys
w = sys.argv[1]
j = json.load(open(w + "/now.json"))
wr = j["ops"]["write"]
assert wr["count"] >= 600, wr
assert 0 < wr["p50_ns"] <= wr["p99_ns"] <= wr["p999_ns"] <= wr["max_ns"], wr
assert j["io"]["written_bytes"] >= 3 * 200 * 65536, j["io"]
assert j["ops"]["read"]["count"] > 0 and j["io"]["read_bytes"] > 0
c = j["commands"]
assert set(c) == {"read", "write", "flush", "trim"}, c
assert c["write"]["bytes"] >= 3 * 200 * 65536, c["write"]
assert c["flush"]["count"] > 0 and c["read"]["count"] > 0, c
for k in ("read", "write", "flush"):
    assert 0 < c[k]["p50_ns"] <= c[k]["p99_ns"] <= c[k]["p999_ns"] <= c[k]["max_ns"], (k, c[k])
pairs = j["queues"]["pairs"]
assert len(pairs) == j["device"]["io_queues"], (pairs, j["device"])
assert sum(q["completed"] for q in pairs) >= c["write"]["count"] // 32, pairs
for i in (1, 2, 3):
    lines = [json.loads(l) for l in open("%s/w%d.jsonl" % (w, i))]
    assert len(lines) == 10, len(lines)
    counts = [l["ops"]["write"]["count"] for l in lines]
    assert counts == sorted(counts), counts
PY
    # A large O_DIRECT write moves from the worker's receive buffer (DMA memory) to the device
    # without a bounce: 8 MiB more written, (almost) nothing more bounced (a journal commit
    # meanwhile may bounce its few blocks).
    "$STAT" --json "$mnt" >"$work/before.json" || fail "warpfs-stat --json"
    head -c 8M /dev/urandom >"$work/big.src" || fail "head /dev/urandom"
    dd if="$work/big.src" of="$mnt/big" bs=1M oflag=direct status=none || fail "dd direct"
    "$STAT" --json "$mnt" >"$work/after.json" || fail "warpfs-stat --json"
    python3 - "$work" <<'PY' || fail "warpfs-stat: a large direct write was bounced"
import json, sys
w = sys.argv[1]
b = json.load(open(w + "/before.json"))["commands"]["write"]
a = json.load(open(w + "/after.json"))["commands"]["write"]
assert a["bytes"] - b["bytes"] >= 8 << 20, (b, a)
assert a["bounced_bytes"] - b["bounced_bytes"] < 1 << 20, (b, a)
PY
    # Reads take no line of the software cache (the page cache, or an O_DIRECT reader's
    # buffer, keeps what was read): four readers at once of that file, which its writes left
    # outside the cache, two buffered with fadvise(RANDOM) (no read-ahead: each page a 4 KiB
    # request) and two O_DIRECT, 4 KiB at random. Every byte is the file's, no read is a miss
    # (a line taken and filled), and at least the direct readers' bytes (every one of their
    # reads reaches the daemon; the buffered ones' repeats stay in the page cache) moved
    # around the cache. sync first, so that no commit's journal writes (which take lines)
    # fall inside the window.
    sync -f "$mnt" || fail "sync"
    misses0=$(stat_of cache.misses) && bypassed0=$(stat_of cache.bypassed_bytes) || fail "stat"
    pids=()
    for i in 1 2 3 4; do
      python3 - "$mnt/big" "$work/big.src" "$i" <<'PY' &
import mmap, os, random, sys
path, src, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = open(src, "rb").read()
direct = seed % 2 == 0
fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
if not direct:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
rng = random.Random(seed)
for _ in range(300):
    off = rng.randrange(len(want) // 4096) * 4096
    n = os.preadv(fd, [buf], off)
    assert n == 4096 and buf[:] == want[off:off + 4096], (path, direct, off, n)
PY
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a reader of big read other bytes"; done
    misses1=$(stat_of cache.misses) && bypassed1=$(stat_of cache.bypassed_bytes) || fail "stat"
    ((misses1 == misses0)) || fail "reads took cache lines: misses $misses0 -> $misses1"
    ((bypassed1 - bypassed0 >= 2 * 300 * 4096)) ||
      fail "reads around the cache: bypassed bytes $bypassed0 -> $bypassed1"
    # A SETATTR's or LINK's reply goes out already expired (the kernel takes those attributes
    # whatever their version, so an asynchronous direct write's notification could not undo
    # them): the next stat asks the daemon once, the one after it is the kernel's.
    touch "$mnt/t" && stat "$mnt/t" >/dev/null || fail "touch t"
    for change in "touch -d @1000 $mnt/t" "ln $mnt/t $mnt/t2"; do
      $change || fail "$change"
      stat "$mnt" >/dev/null || fail "stat of the root"  # its own GETATTR after a new name
      "$STAT" --json "$mnt" >"$work/sa0.json" || fail "warpfs-stat --json"
      m1=$(stat -c %Y "$mnt/t") && m2=$(stat -c %Y "$mnt/t") || fail "stat t"
      "$STAT" --json "$mnt" >"$work/sa1.json" || fail "warpfs-stat --json"
      [[ $m1 == 1000 && $m2 == 1000 ]] || fail "mtime after '$change': $m1 $m2"
      python3 - "$work" "$change" <<'PY' || fail "the reply to '$change' was not asked for again once"
import json, sys
w = sys.argv[1]
b = json.load(open(w + "/sa0.json"))["ops"]["getattr"]["count"]
a = json.load(open(w + "/sa1.json"))["ops"]["getattr"]["count"]
assert a - b == 1, (sys.argv[2], b, a)
PY
    done
    text=$("$STAT" "$mnt")
    grep -q "^write " <<<"$text" || fail "warpfs-stat (text) shows no write line"
    grep -q "^dev.flush " <<<"$text" || fail "warpfs-stat (text) shows no device flush line: $text"
    grep -q "^queue pairs" <<<"$text" || fail "warpfs-stat (text) shows no queue pairs: $text"
    out=$(su nobody -s /bin/sh -c "$STAT $mnt" 2>&1) && fail "nobody read the live view"
    grep -q "permission denied" <<<"$out" || fail "nobody's warpfs-stat: $out"
    unmount_fs
    [[ -e $sock ]] && fail "the socket outlived the mount"
    "$STAT" "$mnt" >/dev/null 2>&1 && fail "warpfs-stat of an unmounted directory"
    fsck_clean >/dev/null
    # Synchronous O_DIRECT writers of different blocks of one file reach the daemon together
    # (FOPEN_PARALLEL_DIRECT_WRITES): four of them meet there. Without it the kernel holds the
    # inode lock across each write and the peak is 1, or 2 where the next write arrives
    # between a handler's reply and its return. A 2 ms device with no software cache keeps
    # each write in the daemon long enough for the four writers to meet. The bytes are each
    # writer's, in place.
    mount_fs -o latency_us=2000,cache_mb=0
    head -c $((4 * 128 * 4096)) /dev/urandom >"$work/src"
    head -c $((4 * 128 * 4096)) /dev/zero >"$mnt/par" || fail "par: the first write"
    pids=()
    for i in 0 1 2 3; do
      dd if="$work/src" of="$mnt/par" bs=4k skip=$((i * 128)) seek=$((i * 128)) count=128 \
        oflag=direct conv=notrunc status=none &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a direct writer failed"; done
    cmp "$work/src" "$mnt/par" || fail "par: the direct writers' bytes"
    peak=$(stat_of ops.write.peak_in_flight)
    kv=$(uname -r | awk -F. '{ printf "%d%03d", $1, $2 }')
    if ((kv >= 6002)); then  # FOPEN_PARALLEL_DIRECT_WRITES: FUSE 7.38, Linux 6.2
      ((peak >= 4)) || fail "direct writes of one file reached the daemon one by one (peak $peak)"
    fi
    # Buffered writes cost one request each: the kernel asks for security.capability once,
    # not before every write (FUSE_HANDLE_KILLPRIV_V2: S_NOSEC).
    x0=$(stat_of ops.getxattr.count) w0=$(stat_of ops.write.count)
    dd if="$work/src" of="$mnt/par" bs=4k count=200 conv=notrunc status=none || fail "buffered writes"
    x1=$(stat_of ops.getxattr.count) w1=$(stat_of ops.write.count)
    ((w1 - w0 >= 200 && x1 - x0 <= 2)) ||
      fail "200 buffered writes: $((w1 - w0)) WRITEs and $((x1 - x0)) GETXATTRs (1 or 2 expected)"
    # Reads whose commands are still on the 2 ms device when their handler returns are
    # answered by the daemon's reapers (-o async_reads=2), while a writer extends the file and
    # another truncates a second one: four O_DIRECT readers, each byte in place. A handler
    # whose read is the only one in flight waits for it itself, so not all 512 are counted as
    # answered later: a quarter at least.
    unmount_fs
    mount_fs -o latency_us=2000,cache_mb=0,async_reads=2
    a0=$(stat_of transport.reads_answered_later)
    head -c $((64 * 4096)) /dev/urandom >"$mnt/par2" || fail "par2"
    dd if=/dev/zero of="$mnt/par" bs=4k seek=$((4 * 128)) count=64 oflag=direct conv=notrunc \
      status=none &
    pids=($!)
    truncate -s 4096 "$mnt/par2" &
    pids+=($!)
    for i in 0 1 2 3; do
      dd if="$mnt/par" of="$work/rd$i" bs=4k skip=$((i * 128)) count=128 iflag=direct \
        status=none &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a direct reader or its neighbours failed"; done
    for i in 0 1 2 3; do
      cmp "$work/rd$i" <(tail -c +$((i * 128 * 4096 + 1)) "$work/src" | head -c $((128 * 4096))) ||
        fail "direct reader $i: the bytes differ"
    done
    a1=$(stat_of transport.reads_answered_later)
    echo "live: $((a1 - a0)) of 512 reads answered later" >&2
    ((a1 - a0 >= 128)) || fail "512 reads of a 2 ms device: $((a1 - a0)) answered by the reapers"
    unmount_fs
    fsck_clean >/dev/null
    # Every read counts in the read operation's statistics, timed to its answer: four readers
    # alone (no writer for them to queue behind), each read waiting for the 2 ms device
    # whether its handler or a reaper answered it. A reaper's read timed to its handler's
    # return would take microseconds.
    mount_fs -o latency_us=2000,cache_mb=0,async_reads=2
    pids=()
    for i in 0 1 2 3; do
      dd if="$mnt/par" of=/dev/null bs=4k skip=$((i * 64)) count=64 iflag=direct status=none &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a direct reader failed"; done
    # A reaper counts its read just after the answer that lets dd go on: the last may still be
    # on its way into the statistics when dd exits.
    for _ in $(seq 100); do
      n=$(stat_of ops.read.count)
      ((n >= 256)) && break
    done
    later=$(stat_of transport.reads_answered_later) p50=$(stat_of ops.read.p50_ns)
    echo "live: $later of $n reads answered later, median $p50 ns" >&2
    # More than half answered by the reapers, so the median is one of theirs.
    ((later * 2 > n && n >= 256 && p50 >= 1000000)) ||
      fail "256 reads of a 2 ms device: $later answered later, ops.read counts $n, median $p50 ns"
    unmount_fs
    # -o async_reads=0: each worker waits for its read; none is answered later.
    mount_fs -o latency_us=2000,cache_mb=0,async_reads=0
    dd if="$mnt/par" of="$work/rd0" bs=4k count=32 iflag=direct status=none || fail "read, async_reads=0"
    cmp "$work/rd0" <(head -c $((32 * 4096)) "$work/src") || fail "async_reads=0: the bytes differ"
    [[ $(stat_of transport.reads_answered_later) == 0 ]] || fail "async_reads=0 answered reads later"
    unmount_fs
    fsck_clean >/dev/null
    ;;
  uring)  # -o io_uring: the POSIX suite, fsx and processes on every CPU at once through FUSE over io_uring
    # Skipped (77) where the kernel has no FUSE over io_uring (before Linux 6.14, or built
    # without CONFIG_FUSE_IO_URING) or its parameter cannot be set here.
    [[ -e $uring_param ]] || { echo "SKIP: no $uring_param"; exit 77; }
    [[ $(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0) != 2 ]] ||
      { echo "SKIP: kernel.io_uring_disabled is 2"; exit 77; }
    was=$(cat "$uring_param")
    { echo 1 >"$uring_param"; } 2>/dev/null || { echo "SKIP: $uring_param cannot be set"; exit 77; }
    uring_was=$was
    ncpu=$(nproc)
    # cpus FILE: the CPU ids of a kernel CPU list ("0-3,6"), one a line
    cpus() { tr ',' '\n' <"$1" | awk -F- '{for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c}'; }
    possible=$(cpus /sys/devices/system/cpu/possible | wc -l)  # the kernel's queues
    online=$(cpus /sys/devices/system/cpu/online | wc -l)
    # ring_threads: the daemon's ring threads (named fuse-ring), one line each: TID CPUS
    ring_threads() {
      local t
      for t in /proc/"$daemon_pid"/task/*; do
        [[ $(cat "$t/comm" 2>/dev/null) == fuse-ring ]] || continue
        echo "${t##*/} $(awk '/^Cpus_allowed_list/ {print $2}' "$t/status")"
      done
    }
    ring_errors() {
      ! grep -i "io_uring" "$work/daemon.log" || fail "the daemon logged the above"
    }
    # parallel_io: four processes, spread over the CPUs, write their own quarter of one file
    # (buffered and O_DIRECT alternately) while four read another: requests from every CPU's
    # queue at once, each byte in its place.
    parallel_io() {
      local i p pids=() flag
      head -c $((4 << 20)) /dev/urandom >"$work/src"
      cp "$work/src" "$mnt/readme" || fail "cp"
      head -c $((4 << 20)) /dev/zero >"$mnt/par" || fail "par: the first write"
      for i in 0 1 2 3; do
        flag=; ((i % 2)) && flag=oflag=direct
        taskset -c $((i % ncpu)) dd if="$work/src" of="$mnt/par" bs=4k skip=$((i * 256)) \
          seek=$((i * 256)) count=256 conv=notrunc $flag status=none &
        pids+=($!)
        taskset -c $(((i + 1) % ncpu)) bash -c \
          'for _ in 1 2 3 4 5; do cmp -s "$1" "$2" || exit 1; done' _ "$work/src" "$mnt/readme" &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || fail "a writer or reader failed"; done
      cmp "$work/src" "$mnt/par" || fail "par: the writers' bytes"
    }
    # served_without_ring WHAT MESSAGE: the mount serves /dev/fuse only, and its log says MESSAGE
    served_without_ring() {
      echo x >"$mnt/f" && [[ $(cat "$mnt/f") == x ]] || fail "$1"
      grep -q "$2" "$work/daemon.log" || fail "$1: no message: $(cat "$work/daemon.log")"
      [[ $(stat_of transport.io_uring_requests) == 0 ]] || fail "$1: requests went through a ring"
      unmount_fs
    }

    format 2G --inodes 300000

    # The default: at least two threads a queue, unpinned.
    mount_fs -o io_uring
    WARPFS_TEST_DIR=$mnt WARPFS_TEST_FS=warpfs "$POSIX_TESTS" || fail "posix_tests over io_uring"
    "$FSX" -q -N 30000 -S 3 "$mnt/fsx.small" || fail "fsx over io_uring"
    parallel_io
    n=$(stat_of transport.io_uring_requests)
    ((n > 10000)) || fail "only ${n:-no} requests went through io_uring"
    threads=$(ring_threads | wc -l)
    ((threads >= 2 * possible)) || fail "$threads ring threads for $possible possible CPUs"
    unmount_fs
    ring_errors
    fsck_clean >/dev/null

    # io_uring_depth=3,io_uring_cpu: three threads a queue, each on its queue's CPU.
    mount_fs -o io_uring,io_uring_depth=3,io_uring_cpu
    threads=$(ring_threads | wc -l)
    # Three for each online CPU's queue, one for each other possible CPU's.
    ((threads == 3 * online + possible - online)) ||
      fail "$threads ring threads for $online online and $possible possible CPUs"
    for c in $(cpus /sys/devices/system/cpu/online); do
      [[ $(ring_threads | awk -v c="$c" '$2 == c' | wc -l) == 3 ]] ||
        fail "not 3 ring threads on CPU $c: $(ring_threads)"
    done
    "$FSX" -q -N 10000 -S 5 "$mnt/fsx.depth" || fail "fsx with io_uring_depth=3"
    parallel_io
    unmount_fs
    ring_errors
    fsck_clean >/dev/null

    # SIGTERM while writers on every CPU keep the ring busy: the daemon answers what it holds,
    # unmounts and leaves a clean filesystem holding every block a write(2) returned for.
    mount_fs -o io_uring
    head -c $((256 << 20)) /dev/urandom >"$work/pattern"
    pids=()
    for i in 0 1 2 3; do
      flag=; ((i % 2)) && flag=oflag=direct
      taskset -c $((i % ncpu)) dd if="$work/pattern" of="$mnt/load$i" bs=64k $flag \
        2>"$work/dd$i.log" &
      pids+=($!)
    done
    before=$(stat_of transport.io_uring_requests)
    busy=0
    for _ in $(seq 1 600); do  # until the writers' requests go through the ring
      (($(stat_of transport.io_uring_requests) > before + 500)) && { busy=1; break; }
      sleep 0.05
    done
    ((busy)) || fail "the writers' requests do not go through the ring"
    kill -TERM "$daemon_pid"
    for _ in $(seq 1 600); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$daemon_pid" 2>/dev/null && fail "the daemon still runs 30 s after SIGTERM under load"
    wait "$daemon_pid" || { cat "$work/daemon.log" >&2; fail "the daemon failed on SIGTERM under load"; }
    daemon_pid=
    for p in "${pids[@]}"; do wait "$p" || true; done  # cut off by the unmount: any status
    mountpoint -q "$mnt" && fail "still mounted after SIGTERM"
    ring_errors
    "$FSCK" -n "emu:$img" | grep -q clean || fail "superblock not clean after SIGTERM under load"
    fsck_clean >/dev/null
    mount_fs
    for i in 0 1 2 3; do  # dd's "N+M records out": N whole 64 KiB writes returned
      n=$(sed -n 's/^\([0-9]*\)+[0-9]* records out$/\1/p' "$work/dd$i.log")
      [[ -n $n ]] || fail "dd $i said: $(cat "$work/dd$i.log")"
      cmp -n $((n << 16)) "$work/pattern" "$mnt/load$i" ||
        fail "load$i: the $n writes dd saw return are not all there"
    done
    unmount_fs

    # Where io_uring cannot be set up (kernel.io_uring_disabled=2, as a seccomp filter would
    # refuse it), the daemon finds out before INIT, says so and serves /dev/fuse.
    if [[ -w /proc/sys/kernel/io_uring_disabled ]]; then
      disabled_was=$(cat /proc/sys/kernel/io_uring_disabled)
      echo 2 >/proc/sys/kernel/io_uring_disabled
      mount_fs -o io_uring
      echo "$disabled_was" >/proc/sys/kernel/io_uring_disabled
      disabled_was=
      served_without_ring "with io_uring disabled" \
        "io_uring transport: setting up a ring: .*requests stay on /dev/fuse"
    fi

    # With the writeback cache the daemon refuses the ring and says why.
    mount_fs -o io_uring,writeback_cache
    served_without_ring "with writeback_cache" "io_uring is not used with writeback_cache"

    # Where the kernel does not offer it, the daemon says so and serves /dev/fuse.
    echo 0 >"$uring_param"
    mount_fs -o io_uring
    served_without_ring "without the kernel's offer" "does not offer FUSE over io_uring"
    fsck_clean >/dev/null
    ;;
  acl)  # POSIX ACLs: setfacl/getfacl, enforced for another user, inherited, kept across a remount
    format 256M
    mount_fs
    echo secret >"$mnt/f"
    chmod 600 "$mnt/f"
    su nobody -s /bin/sh -c "cat $mnt/f" >/dev/null 2>&1 && fail "nobody read a 0600 file"
    setfacl -m u:nobody:r "$mnt/f" || fail "setfacl -m u:nobody:r"
    [[ $(stat -c %A "$mnt/f") == -rw-r----- ]] || fail "the mode does not show the mask: $(stat -c %A "$mnt/f")"
    [[ $(su nobody -s /bin/sh -c "cat $mnt/f") == secret ]] || fail "nobody cannot read through the ACL"
    su nobody -s /bin/sh -c "echo x >>$mnt/f" 2>/dev/null && fail "nobody wrote with a read-only entry"
    chmod 600 "$mnt/f"
    getfacl -c "$mnt/f" 2>/dev/null | grep -qx "mask::---" || fail "chmod did not empty the mask: $(getfacl -c "$mnt/f")"
    su nobody -s /bin/sh -c "cat $mnt/f" >/dev/null 2>&1 && fail "nobody read after chmod 600"
    setfacl -b "$mnt/f" || fail "setfacl -b"
    [[ $(getfacl -c "$mnt/f" 2>/dev/null | grep -c .) -eq 3 ]] || fail "setfacl -b left entries"
    # A directory's default ACL: new files and directories inherit it; the umask does not apply.
    mkdir "$mnt/d"
    setfacl -d -m u:nobody:rwx "$mnt/d" || fail "setfacl -d"
    (umask 077 && touch "$mnt/d/new" && mkdir "$mnt/d/sub") || fail "create in a directory with a default ACL"
    getfacl -c "$mnt/d/new" 2>/dev/null | grep -q "^user:nobody:rwx" || fail "no inherited entry: $(getfacl -c "$mnt/d/new")"
    [[ $(stat -c %a "$mnt/d/new") == 664 ]] || fail "inherited mode $(stat -c %a "$mnt/d/new"), not 664"
    getfacl -c "$mnt/d/sub" 2>/dev/null | grep -q "^default:user:nobody:rwx" || fail "the subdirectory has no default ACL"
    su nobody -s /bin/sh -c "echo from-nobody >$mnt/d/new" || fail "nobody cannot write through the inherited entry"
    unmount_fs
    fsck_clean >/dev/null
    mount_fs
    getfacl -c "$mnt/d/new" 2>/dev/null | grep -q "^user:nobody:rwx" || fail "the ACL did not survive a remount"
    [[ $(cat "$mnt/d/new") == from-nobody ]] || fail "nobody's write is gone"
    unmount_fs
    fsck_clean >/dev/null
    ;;
  dump)  # dump.warpfs shows what the image holds: superblock, groups, an inode's extents, a directory
    format 256M -L dumped
    mount_fs
    mkdir -p "$mnt/d/e"
    head -c 300000 /dev/urandom >"$work/f.orig"
    cp "$work/f.orig" "$mnt/d/e/f"
    ln -s /d/e/f "$mnt/d/link"
    out=$("$DUMP" "emu:$img" 2>&1) && fail "dump.warpfs beside a mount"
    unmount_fs
    js=$("$DUMP" --json "emu:$img") || fail "dump.warpfs --json"
    python3 - "$js" <<'PY' || fail "dump.warpfs: superblock and groups"
import json, sys
j = json.loads(sys.argv[1])
sb = j["superblock"]
assert sb["label"] == "dumped" and sb["state"] == "clean" and sb["checksum_ok"], sb
assert len(j["groups"]) == sb["group_count"] and all(g["checksum_ok"] for g in j["groups"]), j["groups"]
assert sum(g["free_blocks"] for g in j["groups"]) == sb["free_blocks"], "group free counts"
assert j["journal"]["header_ok"] and j["journal"]["pending_transactions"] == 0, j["journal"]
PY
    # The file's extents hold its bytes: read them straight from the image.
    js=$("$DUMP" --json --path /d/e/f "emu:$img") || fail "dump.warpfs --path"
    python3 - "$js" "$img" "$work/f.orig" <<'PY' || fail "dump.warpfs: the extents do not hold the file's data"
import json, sys
j = json.loads(sys.argv[1])
assert j["type"] == "file" and j["size"] == 300000, j
img = open(sys.argv[2], "rb")
data = bytearray()
for e in sorted(j["extents"], key=lambda e: e["logical"]):
    assert len(data) == e["logical"] * 4096, "a hole in a file written in one go"
    img.seek(e["physical"] * 4096)
    data += img.read(e["blocks"] * 4096)
assert bytes(data[:j["size"]]) == open(sys.argv[3], "rb").read(), "bytes differ"
PY
    "$DUMP" --path /d "emu:$img" | grep -q "name=link .*type=10" || fail "dump.warpfs: the directory's entries"
    [[ $("$DUMP" --json --path /d/link "emu:$img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["target"])') == /d/e/f ]] \
      || fail "dump.warpfs: the symlink's target"
    out=$("$DUMP" --inode 4000 "emu:$img" 2>&1) && fail "dump.warpfs of a free inode"
    grep -q "not in use" <<<"$out" || fail "dump.warpfs of a free inode: $out"
    out=$("$DUMP" --path /d/nothing "emu:$img" 2>&1) && fail "dump.warpfs of a missing path"
    "$DUMP" --inode 0 "emu:$img" 2>/dev/null; [[ $? -eq 2 ]] || fail "dump.warpfs --inode 0 is not a usage error"
    fsck_clean >/dev/null
    ;;
  resize)  # resize.warpfs grows an unmounted image after truncate -s; a mounted one is refused
    format 64M
    mount_fs
    mkdir "$mnt/d"
    for i in $(seq 1 40); do head -c $((i * 7000)) /dev/urandom >"$mnt/d/f$i"; done
    sums=$(cd "$mnt/d" && sha256sum f*)
    unmount_fs
    truncate -s 1G "$img"
    mount_fs
    out=$("$RESIZE" "emu:$img" 2>&1) && fail "resize.warpfs grew a mounted image"
    grep -q "mounted" <<<"$out" || fail "resize.warpfs on a mounted image: unclear message: $out"
    unmount_fs
    "$RESIZE" "emu:$img" 12x 2>/dev/null; [[ $? -eq 2 ]] || fail "resize.warpfs SIZE 12x is not a usage error"
    out=$("$RESIZE" "emu:$img" 512M) || fail "resize.warpfs to 512M: $out"
    grep -q "grown from 16384 to 131072 blocks (1 to 4 groups)" <<<"$out" || fail "resize.warpfs: $out"
    fsck_clean >/dev/null
    "$RESIZE" -q "emu:$img" || fail "resize.warpfs to the image's size"
    fsck_clean >/dev/null
    out=$("$RESIZE" "emu:$img" 2>&1) && fail "resize.warpfs grew a filesystem that fills its image"
    grep -q "already has" <<<"$out" || fail "resize.warpfs with nothing to grow: unclear message: $out"
    mount_fs
    [[ $(cd "$mnt/d" && sha256sum f*) == "$sums" ]] || fail "files changed across the resize"
    size_kb=$(df -k --output=size "$mnt" | tail -1)
    (( size_kb > 900000 )) || fail "df after the resize: $size_kb KiB"
    head -c 600M /dev/zero >"$mnt/big" || fail "600 MiB did not fit after the resize"
    unmount_fs
    fsck_clean >/dev/null
    ;;
  errors)  # bad input gets a clear message and a non-zero exit, never a crash or a hang
    out=$("$WARPFS" -f "emu:$work/missing.img" "$mnt" 2>&1) && fail "mounted a missing image"
    grep -qi "missing.img" <<<"$out" || fail "no message naming the missing image: $out"
    head -c $((8 << 20)) /dev/urandom >"$img"
    out=$("$WARPFS" -f "emu:$img" "$mnt" 2>&1) && fail "mounted random data"
    grep -qi "not a warpfs" <<<"$out" || fail "unclear message for random data: $out"
    rm -f "$img"
    format 64M
    # tune.warpfs: shows and changes an unmounted filesystem; refuses a mounted one and bad values.
    "$TUNE" -L "scratch" -c 3 -m 10 "emu:$img" || fail "tune.warpfs"
    out=$("$TUNE" "emu:$img") || fail "tune.warpfs (list)"
    grep -q "^label: *scratch$" <<<"$out" || fail "tune.warpfs did not set the label: $out"
    grep -q "^commit interval: *3 s$" <<<"$out" || fail "tune.warpfs did not set the commit interval: $out"
    "$TUNE" -m 51 "emu:$img" 2>/dev/null; [[ $? -eq 2 ]] || fail "tune.warpfs -m 51 is not a usage error"
    # Default mount options: the superblock's apply where the command line names none.
    "$TUNE" -o cache_mb=8 "emu:$img" 2>/dev/null; [[ $? -eq 2 ]] || fail "tune.warpfs -o cache_mb= is not a usage error"
    "$TUNE" -E mount_opts=ro,meta_cache_mb=4 "emu:$img" || fail "tune.warpfs -E mount_opts="
    grep -q "^default mount options: ro,meta_cache_mb=4$" <<<"$("$TUNE" "emu:$img")" || fail "tune.warpfs -l: no default mount options"
    mount_fs -o stats="$work/defaults.json"
    findmnt -no OPTIONS "$mnt" | grep -qE '(^|,)ro(,|$)' || fail "the superblock's ro did not reach the kernel: $(findmnt -no OPTIONS "$mnt")"
    touch "$mnt/x" 2>/dev/null && fail "wrote on a mount the superblock made read-only"
    unmount_fs
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if s["fs"]["read_only"] and s["fs"]["meta_cache_mb"] == 4 else 1)' \
      "$work/defaults.json" || fail "the superblock's defaults did not reach the filesystem: $(cat "$work/defaults.json")"
    mount_fs -o rw  # the command line wins
    touch "$mnt/x" || fail "-o rw did not override the superblock's ro"
    unmount_fs
    "$TUNE" -o "" "emu:$img" || fail "tune.warpfs -o '' (clear)"
    grep -q "^default mount options: (none)$" <<<"$("$TUNE" "emu:$img")" || fail "tune.warpfs -o '' did not clear them"
    mount_fs
    out=$("$TUNE" -L other "emu:$img" 2>&1) && fail "tune.warpfs changed a mounted image"
    grep -q "mounted" <<<"$out" || fail "tune.warpfs on a mounted image: unclear message: $out"
    unmount_fs
    [[ $("$TUNE" "emu:$img" | grep "^label:") == "label:                 scratch" ]] || fail "the label changed under a mount"
    out=$("$WARPFS" -f "emu:$img" "$mnt" -o queues=0 2>&1) && fail "accepted queues=0"
    mountpoint -q "$mnt" && fail "mounted despite a bad option"
    # An option only libfuse can refuse (it used to exit 0: 1 is also SIGHUP's number).
    out=$("$WARPFS" -f "emu:$img" "$mnt" -o no_such_fuse_option 2>&1) && fail "exit 0 after an unknown FUSE option"
    grep -q "no_such_fuse_option" <<<"$out" || fail "no message naming the unknown option: $out"
    # fsck as fsck(8) and systemd-fsck call it: -a (preen) and -C FD (e2fsck's progress lines).
    "$FSCK" -a "emu:$img" >/dev/null || fail "fsck -a of a clean image"
    "$FSCK" -f -n -C 3 "emu:$img" >/dev/null 3>"$work/progress" || fail "fsck -C 3"
    grep -Eq "^1 [0-9]+ [0-9]+ emu:$img\$" "$work/progress" || fail "no progress lines: $(cat "$work/progress")"
    out=$("$FSCK" -n -C 9 "emu:$img" 2>&1) && fail "fsck -C of a closed descriptor was accepted"
    grep -q "not an open file descriptor" <<<"$out" || fail "unclear message for -C 9: $out"
    # A damaged primary superblock: the backup mounts (and says so).
    printf 'garbage' | dd of="$img" bs=1 seek=200 conv=notrunc status=none
    mount_fs
    grep -qi "backup" "$work/daemon.log" || fail "no notice about the backup superblock"
    echo still >"$mnt/ok" || fail "write on the backup-mounted filesystem"
    unmount_fs
    fsck_clean
    ;;
  *) fail "unknown scenario" ;;
esac
echo "PASS ($scenario)"
