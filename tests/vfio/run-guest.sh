#!/usr/bin/env bash
# Boots a Debian kernel in QEMU (TCG) with an emulated NVMe controller behind an emulated
# Intel IOMMU, and runs tests/vfio/guest-tests.sh inside the guest against the controller
# bound to vfio-pci: warpfs's VFIO transport end to end, on a machine without NVMe hardware.
#   usage: run-guest.sh single|multi|nfs|tcp BINDIR
#     single: one controller, one 1 GiB namespace, 512-byte LBAs
#     multi:  one controller, namespaces of 64 MiB, 1 GiB, 256 MiB with 4 KiB LBAs (the
#             filesystem goes on namespace 2), and a second controller with one 64 MiB
#             namespace whose image fails every write that covers one sector (QEMU's
#             blkdebug): a RAID 1 of it and the first controller's namespace 1 loses that
#             member mid-run (guest-tests.sh's raid-faults step)
#     nfs:    no controller: warpfs on an emulated one over an image in the guest's memory,
#             exported by the kernel's NFS server (NFSv4) and mounted back over loopback
#             (tests/vfio/guest-nfs.sh); nfs-utils comes from Debian's packages, cached
#     tcp:    no controller: the kernel's NVMe/TCP target (nvmet-tcp) exports a file in the
#             guest's tmpfs and a RAM disk at 127.0.0.1:4420 and warpfs reaches them through
#             its NVMe/TCP transport (tests/vfio/guest-tcp.sh; with warpfs.bench=1 in
#             WARPFS_VM_APPEND, bench/tcp-guest.sh's benchmark instead)
#   BINDIR: a build directory; the programs found in it are carried into the guest.
# Environment: WARPFS_VM_CACHE (kernel cache, default /var/cache/warpfs-vm), WARPFS_VM_TIMEOUT
# (seconds for the whole guest, default 900), WARPFS_VM_LOG (console log, default
# BINDIR/vfio-guest-CONFIG.log), WARPFS_VM_APPEND (extra kernel command line),
# WARPFS_VM_SELFTEST=1 (the harness's own test: the filesystem steps run on an emulated
# controller over an image in the guest's memory, so that they pass without the transport).
# Each step in the guest prints `WARPFS-STEP NAME PASS|FAIL`; the guest ends with
# `WARPFS-GUEST-DONE`. Prints `N passed, N failed`; exit 0 only if every step passed.
set -euo pipefail

usage() {
  echo "usage: $0 single|multi|nfs|tcp BINDIR" >&2
  exit 2
}
(($# == 2)) || usage
config=$1
bindir=$(cd "$2" && pwd) || usage
case $config in single | multi | nfs | tcp) ;; *) usage ;; esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WARPFS_VM_CACHE:-/var/cache/warpfs-vm}
vm_timeout=${WARPFS_VM_TIMEOUT:-900}
log=${WARPFS_VM_LOG:-$bindir/vfio-guest-$config.log}
# Loaded in this order (dependencies from modules.dep come first); nvme stays out so that
# nothing but vfio-pci claims the controller.
modules=(vfio vfio_iommu_type1 irqbypass vfio_virqfd vfio-pci-core vfio-pci fuse)
# Carried but not loaded at boot: the kernel's nvme driver, for the step that moves the
# controller to it and back with warpfs-pci (/modules/later/order).
later_modules=(nvme)
# The programs carried from the build directory (where a build tree usually has them).
programs=(tests/nvme_tests mkfs/mkfs.warpfs mkfs/fsck.warpfs fs/daemon/warpfs
  tests/tools/warpfs-fsx nvme/warpfs-pci)
if [[ $config == nfs ]]; then
  # The NFS server and client (dependencies from modules.dep: sunrpc, grace, lockd, nfs_acl,
  # auth_rpcgss, netfs, fscache, nfs, dns_resolver); no VFIO, no nvme.
  modules=(fuse nfsd nfsv4)
  later_modules=()
  programs=(mkfs/mkfs.warpfs mkfs/fsck.warpfs fs/daemon/warpfs)
fi
if [[ $config == tcp ]]; then
  # The NVMe/TCP target (configfs, nvmet); a RAM disk for a namespace (brd) and the kernel's
  # initiator for bench/tcp-guest.sh's comparison (nvme-tcp) carried; no VFIO.
  # crc32c_generic: nvmet-tcp's digests ask the crypto API for "crc32c", which nothing loads
  # in this guest (no modprobe tree); without it 6.1's nvmet-tcp oopses releasing the queue
  # (a NULL dereference in nvmet_tcp_release_queue_work) when a host asks for digests.
  modules=(fuse configfs crc32c_generic nvmet nvmet-tcp)
  later_modules=(brd nvme-tcp)  # brd: insmod'ed with its size by guest-tcp.sh
  programs=(tests/nvme_tests mkfs/mkfs.warpfs mkfs/fsck.warpfs fs/daemon/warpfs
    tests/tools/warpfs-fsx bench/warpfs-bench-blockread)
fi
# nfs: what is taken from nfs-utils's packages (the rest of them stays in the cache).
nfs_programs=(usr/sbin/rpc.nfsd usr/sbin/rpc.mountd usr/sbin/exportfs sbin/mount.nfs)

for tool in qemu-system-x86_64 cpio depmod dpkg; do
  command -v "$tool" >/dev/null || { echo "run-guest: $tool is missing (bash scripts/install-deps.sh)" >&2; exit 2; }
done
busybox=$(command -v busybox) || { echo "run-guest: busybox is missing (busybox-static)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/warpfs-vm-$config.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------------------------------------------
# The kernel: the image package linux-image-amd64 points at, unpacked once into the cache
# with its modules.dep, and its vmlinux (ELF with a PVH note: QEMU boots it directly, without
# decompressing in the guest, which TCG makes slow).

# Prints the ELF vmlinux inside bzImage $1 to stdout. The boot protocol header gives the
# payload's place (setup_sects at 0x1f1, payload_offset at 0x248, payload_length at 0x24c).
extract_vmlinux() {
  local bz=$1 sects off len start magic
  sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$bz")
  ((sects == 0)) && sects=4
  off=$(od -An -tu4 -j $((0x248)) -N4 "$bz")
  len=$(od -An -tu4 -j $((0x24c)) -N4 "$bz")
  start=$(((sects + 1) * 512 + off))
  magic=$(od -An -tx1 -j "$start" -N4 "$bz" | tr -d ' \n')
  # The payload ends with its uncompressed size (4 bytes) after the stream: decompressors
  # may complain about it, so their status is not used; the caller checks the ELF magic.
  tail -c +$((start + 1)) "$bz" | head -c "$len" | case $magic in
    fd377a58) xz -dc --single-stream ;;
    28b52ffd) zstd -dcq ;;
    1f8b*) gzip -dc ;;
    5d00*) xz -dc --format=lzma ;;
    *) echo "run-guest: unknown kernel compression (magic $magic)" >&2 ;;
  esac 2>/dev/null || true
}

# apt_answer COMMAND...: COMMAND's output; when it is empty (no package lists yet), COMMAND's
# output after one apt-get update.
apt_answer() {
  local out
  out=$("$@" 2>/dev/null) || true
  if [[ -z $out ]]; then
    apt-get update -qq >/dev/null 2>&1 || true
    out=$("$@" 2>/dev/null) || true
  fi
  printf '%s' "$out"
}

# unpack_debs DIR PACKAGES...: downloads PACKAGES (apt-get download) and unpacks them all into
# DIR/root.
unpack_debs() {
  local dir=$1 p deb
  shift
  mkdir -p "$dir"
  chmod 755 "$dir"  # apt-get download drops to the _apt user when it can
  (cd "$dir" && apt-get download -q "$@" 2>&1 | grep -v '^W: Download is performed unsandboxed') || true
  for p in "$@"; do
    deb=$(find "$dir" -maxdepth 1 -name "${p}_*.deb" | head -1)
    [[ -n $deb ]] || { echo "run-guest: apt-get download $p failed" >&2; exit 2; }
    dpkg -x "$deb" "$dir/root"
    rm -f "$deb"
  done
}

kernel_package() {
  apt-cache depends linux-image-amd64 |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# Sets kver and kdir ($kdir/root is the unpacked package, $kdir/vmlinux or $kdir/vmlinuz).
prepare_kernel() {
  local pkg
  pkg=$(apt_answer kernel_package)
  if [[ -z $pkg ]]; then  # offline: the newest kernel already in the cache
    pkg=$(find "$cache" -mindepth 2 -maxdepth 2 -name .ready -printf '%h\n' 2>/dev/null |
      sort -V | tail -1 | xargs -r basename | sed 's/^/linux-image-/') || true
  fi
  [[ -n $pkg ]] || { echo "run-guest: cannot resolve linux-image-amd64 (apt-cache)" >&2; exit 2; }
  kver=${pkg#linux-image-}
  kdir=$cache/$kver
  [[ -f $kdir/.ready ]] && return 0

  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9  # another run may be filling the cache
  if [[ ! -f $kdir/.ready ]]; then
    echo "run-guest: fetching $pkg into $kdir"
    local tmp=$kdir.tmp
    rm -rf "$tmp"
    unpack_debs "$tmp" "$pkg"
    depmod -b "$tmp/root" "$kver"  # the package ships no modules.dep
    extract_vmlinux "$tmp/root/boot/vmlinuz-$kver" >"$tmp/vmlinux"
    if [[ $(head -c4 "$tmp/vmlinux" | od -An -tx1 | tr -d ' \n') != 7f454c46 ]]; then
      echo "run-guest: no vmlinux in the bzImage; booting the compressed kernel (slower)"
      rm -f "$tmp/vmlinux"
    fi
    rm -rf "$kdir"
    mv "$tmp" "$kdir"
    touch "$kdir/.ready"
  fi
  exec 9>&-
}

# nfs-utils: nfs-kernel-server (rpc.nfsd, rpc.mountd, exportfs) and nfs-common (mount.nfs)
# with the library packages they depend on (libc6 aside: the host's is the same release's),
# unpacked once into the cache's nfs-utils/VERSION. Sets nfsdir ($nfsdir/root: the tree).
nfs_version() {
  apt-cache show --no-all-versions nfs-kernel-server | awk '$1 == "Version:" { print $2; exit }'
}
prepare_nfs_utils() {
  local ver pkgs
  ver=$(apt_answer nfs_version)
  if [[ -z $ver ]]; then  # offline: the newest one already in the cache
    nfsdir=$(find "$cache/nfs-utils" -mindepth 2 -maxdepth 2 -name .ready -printf '%h\n' \
      2>/dev/null | sort -V | tail -1) || true
    [[ -n $nfsdir ]] || { echo "run-guest: cannot resolve nfs-kernel-server (apt-cache)" >&2; exit 2; }
    return 0
  fi
  nfsdir=$cache/nfs-utils/${ver//:/_}
  [[ -f $nfsdir/.ready ]] && return 0
  mkdir -p "$cache/nfs-utils"
  exec 9>"$cache/.lock"
  flock 9
  if [[ ! -f $nfsdir/.ready ]]; then
    echo "run-guest: fetching nfs-utils $ver into $nfsdir"
    # shellcheck disable=SC2207 # package names have no spaces
    pkgs=(nfs-kernel-server nfs-common $(apt-cache depends nfs-kernel-server nfs-common |
      awk '$1 ~ /^[|]?Depends:$/ && $2 ~ /^lib/ && $2 != "libc6" { print $2 }' | sort -u))
    rm -rf "$nfsdir.tmp"
    unpack_debs "$nfsdir.tmp" "${pkgs[@]}"
    rm -rf "$nfsdir"
    mv "$nfsdir.tmp" "$nfsdir"
    touch "$nfsdir/.ready"
  fi
  exec 9>&-
}

# ------------------------------------------------------------------------------------------
# The initramfs: busybox, the modules, the programs with their libraries, the scripts.

root=$work/initramfs

# Copies file $1 to the same path under $root (following links), creating directories.
copy_file() {
  mkdir -p "$root$(dirname "$1")"
  cp -L "$1" "$root$1"
}

# copy_libs PROGRAM [SYSROOT]: copies the shared libraries PROGRAM needs (the dynamic loader
# included). With SYSROOT (an unpacked package tree), the libraries under it come first and
# go to their paths below it (/lib/..., where the guest's loader looks).
copy_libs() {
  local sysroot=${2:-} libpath='' out lib dest
  [[ -n $sysroot ]] && libpath=$(find "$sysroot" -maxdepth 3 -type d -name '*-linux-gnu' | paste -sd:)
  out=$(LD_LIBRARY_PATH=$libpath ldd "$1" 2>/dev/null) || true
  if grep -q 'not found' <<<"$out"; then
    echo "run-guest: warning: $1 needs libraries found nowhere:" \
      "$(awk '/not found/ { print $1 }' <<<"$out" | paste -sd' ')" >&2
  fi
  while read -r lib; do
    dest=$lib
    [[ -n $sysroot && $lib == "$sysroot"/* ]] && dest=${lib#"$sysroot"}
    [[ -e $root$dest ]] && continue
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$lib" "$root$dest"
  done < <(awk '/=> \// { print $3 } /^\t\// { print $1 }' <<<"$out")
}

# Prints the modules to load for names $@, dependencies first, one path per line (relative
# to the modules directory); built-in ones are skipped, unknown ones are an error.
module_order() {
  local mdir=$kdir/root/lib/modules/$kver
  awk -v want="$*" '
    function base(p) { sub(/.*\//, "", p); sub(/\.ko.*/, "", p); gsub(/-/, "_", p); return p }
    function visit(m,   n, i, d) {
      if (m in done) return
      done[m] = 1
      n = split(deps[m], d, " ")
      for (i = n; i >= 1; i--) visit(base(d[i]))  # modprobe loads the last one first
      print path[m]
    }
    FILENAME ~ /modules.builtin$/ { builtin[base($1)] = 1; next }
    { p = $1; sub(/:$/, "", p); m = base(p); path[m] = p; $1 = ""; deps[m] = $0 }
    END {
      n = split(want, w, " ")
      for (i = 1; i <= n; i++) {
        m = w[i]; gsub(/-/, "_", m)
        if (m in builtin) continue
        if (!(m in path)) { print "run-guest: no module " w[i] > "/dev/stderr"; exit 1 }
        visit(m)
      }
    }' "$mdir/modules.builtin" "$mdir/modules.dep"
}

# carry_modules DIR NAMES...: the modules for NAMES (dependencies first, decompressed) into
# DIR, and their load order into DIR/order.
carry_modules() {
  local dir=$1 mdir=$kdir/root/lib/modules/$kver list m name order=()
  shift
  list=$(module_order "$@")
  for m in $list; do
    name=$(basename "$m")
    case $name in
      *.ko.xz) xz -dc "$mdir/$m" >"$dir/${name%.xz}" ;;
      *.ko.zst) zstd -dcq "$mdir/$m" >"$dir/${name%.zst}" ;;
      *.ko.gz) gzip -dc "$mdir/$m" >"$dir/${name%.gz}" ;;
      *) cp "$mdir/$m" "$dir/$name" ;;
    esac
    order+=("${name%%.ko*}")
  done
  printf '%s\n' "${order[@]}" >"$dir/order"
}

# The nfs-utils programs at their paths (not setuid: the guest runs everything as root), the
# names mount.nfs answers to, and the files libtirpc and the resolver read.
carry_nfs_utils() {
  local rel f
  for rel in "${nfs_programs[@]}"; do
    [[ -f $nfsdir/root/$rel ]] || { echo "run-guest: no $rel in $nfsdir" >&2; exit 2; }
    mkdir -p "$root/$(dirname "$rel")"
    rm -f "$root/$rel"  # never write through a busybox link
    install -m 755 "$nfsdir/root/$rel" "$root/$rel"
    copy_libs "$nfsdir/root/$rel" "$nfsdir/root"
  done
  for f in mount.nfs4 umount.nfs umount.nfs4; do
    rm -f "$root/sbin/$f"
    ln -s mount.nfs "$root/sbin/$f"
  done
  for f in /etc/netconfig /etc/services /etc/protocols; do
    [[ -f $f ]] && copy_file "$f"
  done
  [[ -f $root/etc/netconfig ]] || cp "$nfsdir/root/etc/netconfig" "$root/etc/netconfig" 2>/dev/null || true
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
  echo "run-guest: carrying nfs-utils from $(basename "$nfsdir"): ${nfs_programs[*]##*/}"
}

build_initramfs() {
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,proc,sys,dev,tmp,mnt,modules}
  cp "$busybox" "$root/bin/busybox"
  copy_libs "$busybox"  # nothing for busybox-static
  local applet
  for applet in $("$busybox" --list-full); do
    [[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
  done

  carry_modules "$root/modules" "${modules[@]}"
  mkdir -p "$root/modules/later"
  carry_modules "$root/modules/later" "${later_modules[@]}"

  # The programs: the usual place in a build tree first, else any file of that name.
  local rel prog found carried=() missing=()
  for rel in "${programs[@]}"; do
    prog=$(basename "$rel")
    found=$bindir/$rel
    if [[ ! -f $found ]]; then
      found=$(find "$bindir" -name "$prog" -type f -perm -u+x -not -path '*/CMakeFiles/*' 2>/dev/null |
        head -1)
    fi
    if [[ -z $found ]]; then
      missing+=("$prog")
      continue
    fi
    # Debug info only makes the initramfs bigger; the symbols stay for backtraces.
    strip --strip-debug -o "$root/usr/local/bin/$prog" "$found" 2>/dev/null ||
      cp "$found" "$root/usr/local/bin/$prog"
    copy_libs "$found"
    carried+=("$prog")
  done
  echo "run-guest: carrying ${carried[*]:-nothing}${missing[*]:+; not in $bindir: ${missing[*]}}"

  [[ -f /usr/share/misc/pci.ids ]] && copy_file /usr/share/misc/pci.ids  # libpci's names
  [[ $config == nfs ]] && carry_nfs_utils
  ln -s /proc/mounts "$root/etc/mtab"
  echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
  echo 'root:x:0:' >"$root/etc/group"
  install -m 755 "$here/guest-init.sh" "$root/init"
  install -m 755 "$here/guest-tests.sh" "$root/guest-tests.sh"
  [[ $config == nfs ]] && install -m 644 "$here/guest-nfs.sh" "$root/guest-nfs.sh"
  [[ $config == tcp ]] && install -m 755 "$here/guest-tcp.sh" "$root/guest-tcp.sh"
  (cd "$root" && find . | cpio -o -H newc --quiet) >"$work/initrd"
}

# ------------------------------------------------------------------------------------------
# The machine.

prepare_kernel
[[ $config == nfs ]] && prepare_nfs_utils
build_initramfs

kernel=$kdir/vmlinux
[[ -f $kernel ]] || kernel=$kdir/root/boot/vmlinuz-$kver
devices=(-device "intel-iommu,intremap=on,caching-mode=on")
iommu="intel_iommu=on "
nvme=()
if [[ $config == nfs || $config == tcp ]]; then
  devices=()  # nothing to pass through: the filesystem is on an image in guest memory
  iommu=
elif [[ $config == single ]]; then
  truncate -s 1G "$work/ns1.img"
  nvme+=(-drive "file=$work/ns1.img,if=none,id=ns1,format=raw"
    -device "nvme,serial=warpfs-single,drive=ns1")
else
  nvme+=(-device "nvme,id=ctrl0,serial=warpfs-multi")
  nsid=1
  for size in 64M 1G 256M; do
    truncate -s "$size" "$work/ns$nsid.img"
    nvme+=(-drive "file=$work/ns$nsid.img,if=none,id=ns$nsid,format=raw"
      -device "nvme-ns,drive=ns$nsid,bus=ctrl0,nsid=$nsid,logical_block_size=4096,physical_block_size=4096")
    nsid=$((nsid + 1))
  done
  # The second controller: its namespace's image fails (EIO) every write that covers member
  # block 256 + 3072, 12 MiB into the RAID set's data (fs/FORMAT.md "RAID member label"),
  # which mkfs and the first small file leave alone and a 16 MiB file after it crosses.
  # Sector in 512-byte units of the image: (256 + 3072) * 8.
  truncate -s 64M "$work/nsb.img"
  cat >"$work/blkdebug.conf" <<'CONF'
[inject-error]
event = "write_aio"
errno = "5"
sector = "26624"
CONF
  nvme+=(-drive "file=blkdebug:$work/blkdebug.conf:$work/nsb.img,if=none,id=nsb,format=raw"
    -device "nvme,id=ctrl1,serial=warpfs-raid-b"
    -device "nvme-ns,drive=nsb,bus=ctrl1,nsid=1,logical_block_size=4096,physical_block_size=4096")
fi

selftest=
[[ ${WARPFS_VM_SELFTEST:-0} == 1 ]] && selftest="warpfs.selftest=1 "
echo "run-guest: booting $kver ($config) from $(basename "$kernel"), console log $log"
start=$(date +%s%N)
status=0
# Stdin is /dev/null: the serial port is output only, and QEMU leaves the terminal alone.
timeout -k 10 "$vm_timeout" qemu-system-x86_64 \
  -machine q35,kernel-irqchip=split -accel tcg -m 1G -smp 1 \
  "${devices[@]}" \
  -nodefaults -no-reboot -display none -serial stdio \
  -kernel "$kernel" -initrd "$work/initrd" \
  -append "console=ttyS0 panic=-1 ${iommu}loglevel=4 warpfs.config=$config $selftest${WARPFS_VM_APPEND:-}" \
  "${nvme[@]}" </dev/null 2>&1 | tee "$log" || status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))

# ------------------------------------------------------------------------------------------
# The verdict.

passed=$(tr -d '\r' <"$log" | grep -cE 'WARPFS-STEP [^ ]+ PASS$' || true)
failed=$(tr -d '\r' <"$log" | grep -cE 'WARPFS-STEP [^ ]+ FAIL$' || true)
problem=
if ((status == 124 || status == 137)); then
  problem="the guest did not power off within ${vm_timeout}s (killed)"
elif ! tr -d '\r' <"$log" | grep -q 'WARPFS-GUEST-DONE'; then
  problem="the guest stopped before WARPFS-GUEST-DONE (panic, crash or early exit; qemu status $status)"
elif ((status != 0)); then
  problem="qemu exited with status $status"
elif ((passed + failed == 0)); then
  problem="no step ran"
fi
echo
if [[ -n $problem ]]; then
  echo "run-guest: $problem; the last 50 lines of $log:"
  tail -n 50 "$log" | tr -d '\r' | sed 's/^/  | /'
fi
tr -d '\r' <"$log" | grep -E 'WARPFS-STEP [^ ]+ FAIL$' | sed 's/^.*WARPFS-STEP /run-guest: failed: /' || true
printf 'run-guest: the %s guest ran %d.%03d s\n' "$config" $((elapsed_ms / 1000)) $((elapsed_ms % 1000))
echo "$passed passed, $failed failed"
[[ -z $problem ]] && ((failed == 0))
