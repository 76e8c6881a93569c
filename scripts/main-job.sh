#!/usr/bin/env bash
# The main job: install what warpfs needs, build it, drive an emulated NVMe image end to end
# with the NVMe stack's demo (bring-up, Identify, parallel writes with 32 commands in flight
# per thread, flush, verify, shutdown, power-up, verify), then format a warpfs image with
# mkfs.warpfs. (Mounting it comes with the FUSE daemon.)
#   usage: scripts/main-job.sh [IMAGE]     (default /tmp/warpfs.img, 1 GiB, created if absent)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${1:-/tmp/warpfs.img}
demo=/tmp/warpfs-nvme-demo.img
bash "$repo/scripts/install-deps.sh"
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWARPFS_BUILD_TESTS=ON -DWARPFS_BUILD_BENCH=ON >/dev/null
ninja -C "$repo/build" warpfs-nvme-demo mkfs.warpfs
"$repo/build/nvme/warpfs-nvme-demo" --size $((256 << 20)) "emu:$demo"
if [[ -e $image ]]; then
  echo "$image exists: formatting it again (--force)"
  "$repo/build/mkfs/mkfs.warpfs" --force --label warpfs "emu:$image"
else
  "$repo/build/mkfs/mkfs.warpfs" --size 1G --label warpfs "emu:$image"
fi
