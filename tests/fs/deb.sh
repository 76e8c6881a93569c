#!/usr/bin/env bash
# The Debian package: `cpack -G DEB` of the build directory BUILD, installed with dpkg into a
# throwaway root (its own dpkg database; the libraries it names come from this machine, where
# each of its dependencies must be an installed package), then the installed mkfs.warpfs,
# warpfs and fsck.warpfs format, mount, write, read back, unmount and check an image; then
# `dpkg -r` leaves none of its files behind.
#   usage: deb.sh BUILD
set -uo pipefail
build=${1:?build directory}
work=$(mktemp -d "${TMPDIR:-/tmp}/warpfs-deb.XXXXXX")
root=$work/root
mnt=$work/mnt
fail() { echo "FAIL (deb): $*" >&2; exit 1; }
cleanup() {
  mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u -z "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1 \
  || { cat "$work/cpack.log" >&2; fail "cpack -G DEB"; }
deb=$(ls "$work"/pkg/warpfs_*.deb 2>/dev/null | head -1)
[[ -n $deb ]] || fail "cpack made no warpfs_*.deb"

# Its control data: the name, the version, and dependencies this Debian satisfies.
[[ $(dpkg-deb -f "$deb" Package) == warpfs ]] || fail "package name $(dpkg-deb -f "$deb" Package)"
depends=$(dpkg-deb -f "$deb" Depends)
# (xxHash is compiled in, header-only: fs/src/xxh.h; no libxxhash0.)
for need in fuse3 libfuse3-3 libtbb12; do
  grep -qw "$need" <<<"$depends" || fail "Depends lacks $need: $depends"
done
for dep in $(tr ',' '\n' <<<"$depends" | sed 's/(.*)//; s/|.*//' | tr -d ' '); do
  dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q "install ok installed" \
    || fail "dependency $dep is not an installed package here"
done

# Install into the throwaway root (dependencies are this machine's, checked above).
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$mnt"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-depends -i "$deb" >"$work/dpkg.log" 2>&1 \
  || { cat "$work/dpkg.log" >&2; fail "dpkg -i"; }
sbin=$root/usr/sbin
for p in warpfs mkfs.warpfs fsck.warpfs; do
  [[ -x $sbin/$p ]] || fail "the package installs no /usr/sbin/$p"
  [[ -f $root/usr/share/man/man8/$p.8 ]] || fail "the package installs no man page for $p"
done
[[ -f $root/usr/share/doc/warpfs/copyright ]] || fail "no copyright file"

# The installed programs do the main job.
"$sbin/mkfs.warpfs" -q --size 256M "emu:$work/img" || fail "installed mkfs.warpfs"
"$sbin/warpfs" "emu:$work/img" "$mnt" || fail "installed warpfs did not mount"
echo "from the package" >"$mnt/hello" || fail "write through the mount"
[[ $(cat "$mnt/hello") == "from the package" ]] || fail "read back differs"
fusermount3 -u "$mnt" || fail "fusermount3 -u"
# fsck waits (bounded) for the daemon to let go of the image after the unmount.
"$sbin/fsck.warpfs" -f -n "emu:$work/img" >"$work/fsck.log" 2>&1 \
  || { cat "$work/fsck.log" >&2; fail "installed fsck.warpfs found problems"; }

dpkg --root="$root" -r warpfs >>"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -r"; }
left=$(find "$root/usr" -type f 2>/dev/null)
[[ -z $left ]] || fail "dpkg -r left files: $left"
echo "deb: $(basename "$deb") installed, mounted, checked and removed"
