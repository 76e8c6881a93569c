#!/usr/bin/env bash
# The main job: install what warpfs needs, build its programs (Release), install warpfs,
# mkfs.warpfs, fsck.warpfs and warpfs-pci into /usr/local/sbin, format an emulated NVMe image
# if there is none, and mount warpfs on it, ready for any program to use.
#   usage: scripts/main-job.sh [IMAGE [MOUNTPOINT]]
#          (default /var/lib/warpfs/warpfs.img, 4 GiB sparse, and /mnt/warpfs)
# The image's directory is created root-only (0700) when missing, the image itself 0600; the
# daemon's stats go to /run/warpfs/ (0700). Unmount with `fusermount3 -u MOUNTPOINT` (or
# `umount`); the superblock is left clean.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${1:-/var/lib/warpfs/warpfs.img}
mnt=${2:-/mnt/warpfs}
bash "$repo/scripts/install-deps.sh"
# Its own build directory: the programs only, optimised as a user runs them (the test
# builds live in build/, build-asan/ and build-tsan/).
cmake -S "$repo" -B "$repo/build-main" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DWARPFS_BUILD_TESTS=OFF -DWARPFS_BUILD_BENCH=OFF -DWARPFS_CUDA=OFF >/dev/null
ninja -C "$repo/build-main" warpfs-programs  # everything the install component lists
cmake --install "$repo/build-main" --component warpfs >/dev/null
if mountpoint -q "$mnt"; then
  echo "$mnt is already mounted:"; mount | grep " $mnt " || true
  exit 0
fi
imgdir=$(dirname "$image")
if [[ ! -d $imgdir ]]; then
  mkdir -p "$imgdir"
  chmod 0700 "$imgdir"
fi
if [[ ! -e $image ]]; then
  mkfs.warpfs --size 4G --label warpfs "emu:$image"
else
  echo "$image exists: checking it"
  fsck.warpfs -y "emu:$image" || [[ $? -le 1 ]]
fi
install -d -m 0700 /run/warpfs
mkdir -p "$mnt"
warpfs "emu:$image" "$mnt" -o allow_other,stats=/run/warpfs/stats.json
df -h "$mnt"
echo "warpfs is mounted on $mnt (image $image). Unmount: fusermount3 -u $mnt"
