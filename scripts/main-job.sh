#!/usr/bin/env bash
# The main job: install what warpfs needs, build it, install warpfs, mkfs.warpfs and
# fsck.warpfs into /usr/local/sbin, format an emulated NVMe image if there is none, and
# mount warpfs on it, ready for any program to use.
#   usage: scripts/main-job.sh [IMAGE [MOUNTPOINT]]   (default /var/tmp/warpfs.img, 4 GiB
#          sparse, and /mnt/warpfs)
# Unmount with `fusermount3 -u MOUNTPOINT` (or `umount`); the superblock is left clean.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${1:-/var/tmp/warpfs.img}
mnt=${2:-/mnt/warpfs}
bash "$repo/scripts/install-deps.sh"
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWARPFS_BUILD_TESTS=ON -DWARPFS_BUILD_BENCH=ON >/dev/null
ninja -C "$repo/build" warpfs mkfs.warpfs fsck.warpfs
cmake --install "$repo/build" --component warpfs >/dev/null
if mountpoint -q "$mnt"; then
  echo "$mnt is already mounted:"; mount | grep " $mnt " || true
  exit 0
fi
if [[ ! -e $image ]]; then
  mkfs.warpfs --size 4G --label warpfs "emu:$image"
else
  echo "$image exists: checking it"
  fsck.warpfs -y "emu:$image" || [[ $? -le 1 ]]
fi
mkdir -p "$mnt"
warpfs "emu:$image" "$mnt" -o allow_other,stats=/var/tmp/warpfs.stats.json
df -h "$mnt"
echo "warpfs is mounted on $mnt (image $image). Unmount: fusermount3 -u $mnt"
