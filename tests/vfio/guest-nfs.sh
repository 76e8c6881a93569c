# shellcheck shell=sh disable=SC2154 # $state and the step helpers are guest-tests.sh's
# The nfs configuration's steps, sourced by guest-tests.sh (busybox sh, in the QEMU guest):
# warpfs on an emulated controller over an image in the guest's memory, mounted at /mnt/w and
# exported by the kernel's NFS server (nfsd, NFSv4 only), mounted back over loopback at
# /mnt/n; data written on one side is read on the other, and after the server's caches are
# dropped the server finds files again from the client's file handles (warpfs's export
# support: lookups of "." and ".." by node id, ESTALE for a deleted inode).
# The nfs-utils programs (rpc.nfsd, rpc.mountd, exportfs, mount.nfs) come from Debian's
# packages, carried by run-guest.sh.

W=/mnt/w  # the warpfs mount, exported
N=/mnt/n  # the NFS mount of it

# A FUSE operation's count in the daemon's stats (after dump_stats).
op_count() {
  sed -n "s/.*\"$1\":{\"count\":\([0-9]*\).*/\1/p" "$state/stats.json"
}
forgets() {
  dump_stats
  echo $(($(op_count forget) + $(op_count forget_multi)))
}
lookups() {
  dump_stats
  op_count lookup
}
forgets_above() { [ "$(forgets)" -gt "$1" ]; }
nfsd_threads() { [ "$(cat /proc/fs/nfsd/threads)" = "$1" ]; }
nfs_mounted() { awk -v m="$N" '$2 == m && $3 == "nfs4" { f = 1 } END { exit !f }' /proc/mounts; }

# The server's caches and the client's: the dentries and inodes warpfs's FUSE mount held go
# (FORGET reaches the daemon), and so do the client's cached pages.
drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

# same_files SRC DIR: every file under SRC is in DIR with the same contents (sha256), and
# both hold the same names with the same types and permissions.
same_files() {
  (cd "$1" && find . -type f | sort | xargs -r sha256sum) >"$state/same.sums" ||
    fail "sha256sum under $1"
  out=$(cd "$2" && sha256sum -c "$state/same.sums" 2>&1) || {
    echo "$out" | grep -v ': OK$'
    fail "contents under $2 differ from $1"
  }
  (cd "$1" && find . | sort | xargs stat -c '%n %F %a') >"$state/same.a"
  (cd "$2" && find . | sort | xargs stat -c '%n %F %a') >"$state/same.b"
  diff "$state/same.a" "$state/same.b" || fail "the names under $2 differ from $1"
  echo "  $2: $(wc -l <"$state/same.sums") files, $(wc -l <"$state/same.a") names as in $1"
}

# random_files DIR SIZES...: files DIR/f.SIZE of random bytes.
random_files() {
  rf_dir=$1
  shift
  mkdir -p "$rf_dir" || fail "mkdir $rf_dir"
  for size in "$@"; do
    head -c "$size" /dev/urandom >"$rf_dir/f.$size" || fail "writing $rf_dir/f.$size"
  done
}

do_loopback() {
  ip link set lo up || fail "ip link set lo up"
  ip addr show lo | grep -q 'inet 127\.0\.0\.1/' || ip addr add 127.0.0.1/8 dev lo ||
    fail "no 127.0.0.1 on lo"
  ip addr show lo
}

# The export and the server: nfsd's filesystem, /etc/exports, exportfs, rpc.mountd (which
# answers the kernel's export and file handle cache upcalls) and rpc.nfsd with NFSv2 and v3
# off, so that neither lockd nor rpcbind is needed.
do_nfsd_start() {
  requires mount loopback
  [ -d /proc/fs/nfsd ] || fail "no /proc/fs/nfsd (the nfsd module)"
  mount -t nfsd nfsd /proc/fs/nfsd || fail "mount -t nfsd"
  # Owners as numbers with AUTH_SYS, as the client sends them: no rpc.idmapd.
  echo Y >/sys/module/nfsd/parameters/nfs4_disable_idmapping || fail "nfs4_disable_idmapping"
  # No leases, so no delegations: a client's delegation would keep the server's file open,
  # and the handles step needs the server to hold nothing of the files it re-reads (a guard:
  # runs with leases on passed as well).
  echo 0 >/proc/sys/fs/leases-enable || fail "leases-enable"
  # No client tracking (no nfsdcld, no v4recovery): nothing here survives a reboot anyway.
  mkdir -p /var/lib/nfs /run /etc
  : >/var/lib/nfs/etab
  : >/var/lib/nfs/rmtab
  # FUSE has no device UUID: fsid= names the export in the file handles.
  echo "$W 127.0.0.1(rw,sync,no_root_squash,no_subtree_check,fsid=1)" >/etc/exports
  exportfs -ra || fail "exportfs -ra"
  exportfs -v
  (
    rpc.mountd -F -N 2 -N 3 >"$state/mountd.log" 2>&1
    echo $? >"$state/mountd.rc"
  ) </dev/null &
  # NFSv2 only where the kernel has it (Debian's 6.1 is built without: writing -2 to
  # /proc/fs/nfsd/versions fails, "Unsupported version").
  off="-N 3"
  grep -q '[+-]2 ' /proc/fs/nfsd/versions && off="-N 2 -N 3"
  echo "  the kernel's versions: $(cat /proc/fs/nfsd/versions); rpc.nfsd $off"
  # A grace period of 10 s (the least nfsd takes; 90 s by default): the first OPENs wait it out.
  # shellcheck disable=SC2086 # $off is a list of options
  rpc.nfsd $off -G 10 4 || fail "rpc.nfsd"
  wait_until 10 "nfsd has no threads" nfsd_threads 4
  echo "  versions: $(cat /proc/fs/nfsd/versions), threads: $(cat /proc/fs/nfsd/threads)," \
    "ports: $(tr '\n' ' ' </proc/fs/nfsd/portlist)"
  [ -e "$state/mountd.rc" ] && {
    cat "$state/mountd.log"
    fail "rpc.mountd exited with status $(cat "$state/mountd.rc")"
  }
  pidof rpcbind >/dev/null && fail "rpcbind runs (it was not meant to be carried)"
  return 0
}

do_nfs_mount() {
  requires nfsd-start
  mkdir -p "$N"
  mount.nfs4 "127.0.0.1:$W" "$N" -o retry=0 || fail "mount.nfs4 127.0.0.1:$W $N"
  nfs_mounted || fail "no nfs4 mount on $N"
  echo "  $(grep " $N " /proc/mounts)"
}

# Files written through NFS, read back through the warpfs mount.
do_nfs_to_warpfs() {
  requires nfs-mount
  random_files "$state/in" 0 1 4095 4096 65537 1048576 3000001
  cp -a "$state/in" "$N/in" || fail "cp into $N/in"
  same_files "$state/in" "$W/in"
}

# Files written through the warpfs mount, read through NFS; then one rewritten in place
# through warpfs: the client's next open sees the new contents (close-to-open consistency
# through the change attribute nfsd derives from warpfs's ctime).
do_warpfs_to_nfs() {
  requires nfs-mount
  random_files "$state/out" 1 4096 65537 1048576
  cp -a "$state/out" "$W/out" || fail "cp into $W/out"
  same_files "$state/out" "$N/out"
  head -c 65537 /dev/urandom >"$state/out/f.65537"
  cat "$state/out/f.65537" >"$W/out/f.65537" || fail "rewriting $W/out/f.65537"
  same_files "$state/out" "$N/out"
}

# A directory tree with a symlink and an empty directory, copied in through NFS.
do_tree() {
  requires nfs-mount
  src=$state/tree
  for d in a b c; do
    for e in 1 2 3; do
      mkdir -p "$src/$d/$e/deep"
      echo "$d$e" >"$src/$d/$e/name"
      head -c $((${#d} * 7001 + e * 301)) /dev/urandom >"$src/$d/$e/deep/data"
    done
  done
  mkdir "$src/empty"
  chmod 750 "$src/b"
  chmod 600 "$src/c/1/name"
  ln -s ../b/1/name "$src/a/link"
  mkdir "$N/tree" || fail "mkdir $N/tree"
  cp -a "$src/." "$N/tree/" || fail "cp -a into $N/tree"
  same_files "$src" "$W/tree"
  [ "$(readlink "$W/tree/a/link")" = ../b/1/name ] || fail "the symlink reads '$(readlink "$W/tree/a/link")'"
  same_files "$src" "$N/tree"
}

# Creates, unlinks and renames (within a directory, across directories, of a directory)
# through NFS; the warpfs mount sees the result.
do_rename_unlink() {
  requires nfs-mount
  mkdir "$N/r" "$N/r/sub" || fail "mkdir through NFS"
  churn "$N/r" 40
  mv "$N/r/g1" "$N/r/sub/moved" || fail "mv across directories"
  mv "$N/r" "$N/r2" || fail "mv of a directory"
  mkdir "$N/gone.d" || fail "mkdir $N/gone.d"
  rmdir "$N/gone.d" || fail "rmdir $N/gone.d"
  [ ! -e "$W/r" ] || fail "$W/r is still there after the rename"
  [ ! -e "$W/gone.d" ] || fail "$W/gone.d is still there after rmdir"
  [ "$(find "$W/r2" -maxdepth 1 -name 'g*' | wc -l)" = 19 ] ||
    fail "$W/r2 does not hold g3..g39: $(ls "$W/r2")"
  [ "$(find "$W/r2" -maxdepth 1 -name 'f*' | wc -l)" = 0 ] ||
    fail "$W/r2 still holds f files: $(ls "$W/r2")"
  [ "$(cat "$W/r2/sub/moved")" = 1 ] || fail "$W/r2/sub/moved holds '$(cat "$W/r2/sub/moved")'"
  [ "$(cat "$W/r2/g39")" = 39 ] || fail "$W/r2/g39 holds '$(cat "$W/r2/g39")'"
  # And the other way: a rename through warpfs shows through NFS.
  mv "$W/r2/g3" "$W/r2/sub/g3" || fail "mv through warpfs"
  [ ! -e "$N/r2/g3" ] || fail "$N/r2/g3 is still there after the rename through warpfs"
  [ "$(cat "$N/r2/sub/g3")" = 3 ] || fail "$N/r2/sub/g3 holds '$(cat "$N/r2/sub/g3")'"
}

# Several processes at once on both sides of the export: four copy files in through NFS and
# four through warpfs (three copies each of their own random bytes, into one directory), two
# churn names through NFS in directories of their own; then every file is checked from the
# other side.
do_concurrent() {
  requires nfs-mount
  mkdir -p "$state/conc" "$N/c" || fail "mkdir $N/c"
  for p in 1 2 3 4; do
    head -c $((1048576 + p)) /dev/urandom >"$state/conc/n$p"
    head -c $((65536 * p + 7)) /dev/urandom >"$state/conc/w$p"
  done
  pids=
  for p in 1 2 3 4; do
    (for i in 1 2 3; do cp "$state/conc/n$p" "$N/c/n$p.$i" || exit 1; done) &
    pids="$pids $!"
    (for i in 1 2 3; do cp "$state/conc/w$p" "$W/c/w$p.$i" || exit 1; done) &
    pids="$pids $!"
  done
  for p in 1 2; do
    (mkdir "$N/c/churn$p" && churn "$N/c/churn$p" 40) &
    pids="$pids $!"
  done
  failed=0
  for pid in $pids; do
    wait "$pid" || failed=$((failed + 1))
  done
  [ "$failed" = 0 ] || fail "$failed of the writers failed"
  for p in 1 2 3 4; do
    for i in 1 2 3; do
      cmp "$state/conc/n$p" "$W/c/n$p.$i" || fail "$W/c/n$p.$i differs from what was written through NFS"
      cmp "$state/conc/w$p" "$N/c/w$p.$i" || fail "$N/c/w$p.$i differs from what was written through warpfs"
    done
  done
  for p in 1 2; do
    [ "$(find "$W/c/churn$p" -name 'g*' | wc -l)" = 20 ] || fail "$W/c/churn$p does not hold 20 files"
    [ "$(find "$W/c/churn$p" -name 'f*' | wc -l)" = 0 ] || fail "$W/c/churn$p still holds f files"
  done
  echo "  8 writers and 2 churners at once: $(find "$W/c" -type f | wc -l) files checked on the other side"
}

# 16 MiB each way.
do_large() {
  requires nfs-mount
  head -c 16777216 /dev/urandom >"$state/big" || fail "writing $state/big"
  head -c 16777216 /dev/urandom >"$state/big2" || fail "writing $state/big2"
  sum=$(sha256sum <"$state/big")
  sum2=$(sha256sum <"$state/big2")
  cp "$state/big" "$N/big" || fail "cp to $N/big"
  cp "$state/big2" "$W/big2" || fail "cp to $W/big2"
  [ "$(sha256sum <"$W/big")" = "$sum" ] || fail "$W/big differs from what was written through NFS"
  [ "$(sha256sum <"$N/big")" = "$sum" ] || fail "$N/big differs"
  [ "$(sha256sum <"$N/big2")" = "$sum2" ] || fail "$N/big2 differs from what was written through warpfs"
}

# The server decodes file handles: the client keeps a file and a directory of the export
# (bind mounts of them: no open, so the server holds nothing), the caches are dropped (warpfs
# sees the FORGETs), and reading them again makes nfsd turn the client's handles back into
# dentries through FUSE's export operations: a LOOKUP of "." by node id, and for the
# directory ".." to reconnect it.
do_handles() {
  requires large tree
  mkdir -p /tmp/pin-dir && touch /tmp/pin-file
  mount --bind "$N/tree/a" /tmp/pin-dir || fail "bind mount of $N/tree/a"
  mount --bind "$N/big" /tmp/pin-file || fail "bind mount of $N/big"
  f0=$(forgets)
  l0=$(lookups)
  drop_caches
  wait_until 30 "no FORGET reached warpfs after drop_caches" forgets_above "$f0"
  f1=$(forgets)
  [ "$(sha256sum </tmp/pin-file)" = "$(sha256sum <"$state/big")" ] ||
    fail "$N/big read by its handle differs"
  l1=$(lookups)
  same_files "$state/tree/a" /tmp/pin-dir
  l2=$(lookups)
  echo "  drop_caches: $((f1 - f0)) forgets; lookups: $((l1 - l0)) for the file's handle," \
    "$((l2 - l1)) for the directory's and the names in it"
  # Only a LOOKUP can bring the file's inode back into the server's cache.
  [ "$l1" -gt "$l0" ] || fail "no LOOKUP reached warpfs for the file: its handle was not decoded"
  [ "$l2" -gt "$l1" ] || fail "no LOOKUP reached warpfs for the directory"
  # A ".." lookup that reaches the root must answer generation 0, as the kernel's root has.
  if dmesg | grep -q 'fuse: root generation should be zero'; then
    fail "the kernel says 'fuse: root generation should be zero': a LOOKUP answered the root with another generation"
  fi
  return 0
}

# A file deleted through warpfs while the client holds its handle: the client gets ESTALE
# (or ENOENT), never the contents of a file that took the inode number since.
do_stale() {
  requires nfs-mount
  head -c 100000 /dev/urandom >"$W/gone" || fail "writing $W/gone"
  touch /tmp/pin-gone
  mount --bind "$N/gone" /tmp/pin-gone || fail "bind mount of $N/gone"
  ino=$(stat -c %i "$W/gone")
  rm "$W/gone" || fail "rm $W/gone"
  n=1
  reused=
  while [ "$n" -le 16 ]; do
    echo "new file $n" >"$W/new.$n" || fail "create $W/new.$n"
    [ "$(stat -c %i "$W/new.$n")" = "$ino" ] && reused=" (new.$n took inode $ino)"
    n=$((n + 1))
  done
  drop_caches
  out=$(cat /tmp/pin-gone 2>"$state/stale.err")
  rc=$?
  echo "  cat of the deleted file's handle$reused: status $rc, $(cat "$state/stale.err")"
  [ "$rc" != 0 ] || fail "the read succeeded ($(echo "$out" | head -c 40 | od -An -c | head -1))"
  [ -z "$out" ] || fail "the read returned data"
  grep -qi -e 'stale' -e 'no such file' "$state/stale.err" || fail "not ESTALE or ENOENT"
  umount /tmp/pin-gone || fail "umount /tmp/pin-gone"
}

do_nfs_unmount() {
  for pin in /tmp/pin-dir /tmp/pin-file /tmp/pin-gone; do
    grep -q " $pin " /proc/mounts && { umount "$pin" || fail "umount $pin"; }
  done
  nfs_mounted || fail "$N is not mounted"
  umount "$N" || fail "umount $N"
  nfs_mounted && fail "$N is still mounted"
  return 0
}

mountd_exited() { [ -e "$state/mountd.rc" ]; }

# nfsd's threads stop, the export goes, rpc.mountd ends: nothing holds the warpfs mount.
do_nfsd_stop() {
  requires nfsd-start
  rpc.nfsd 0 || fail "rpc.nfsd 0"
  wait_until 30 "nfsd threads still running" nfsd_threads 0
  exportfs -ua || fail "exportfs -ua"
  kill -TERM "$(pidof rpc.mountd)" || fail "no rpc.mountd to stop"
  wait_until 30 "rpc.mountd still running 30 s after SIGTERM" mountd_exited
  umount /proc/fs/nfsd || fail "umount /proc/fs/nfsd"
  sed 's/^/  /' "$state/mountd.log"
}

nfs_steps() {
  MNT=$W
  DEVICE=emu:/tmp/nfs.img
  DEVICE_NAME=emulated
  MKFS_OPTS="--force --size 256M"
  export MNT DEVICE DEVICE_NAME MKFS_OPTS
  mkdir -p "$W"
  step binaries do_binaries mkfs.warpfs fsck.warpfs warpfs rpc.nfsd rpc.mountd exportfs mount.nfs
  step loopback do_loopback
  step mkfs do_mkfs
  step mount do_mount
  step nfsd-start do_nfsd_start
  step nfs-mount do_nfs_mount
  step nfs-to-warpfs do_nfs_to_warpfs
  step warpfs-to-nfs do_warpfs_to_nfs
  step tree do_tree
  step rename-unlink do_rename_unlink
  step -t 300 concurrent do_concurrent
  step -t 300 large do_large
  step handles do_handles
  step stale do_stale
  step nfs-unmount do_nfs_unmount
  step nfsd-stop do_nfsd_stop
  step unmount do_unmount
  step fsck do_fsck
  echo "nfs: kernel messages:"
  dmesg | grep -i -e nfs -e fuse -e rpc | tail -20
}
