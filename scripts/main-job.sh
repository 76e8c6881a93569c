#!/usr/bin/env bash
# The main job: install what warpfs needs, build it, and drive an emulated NVMe image end to
# end. Until the filesystem lands this is the NVMe stack's demo (bring-up, Identify, parallel
# writes with 32 commands in flight per thread, flush, verify, shutdown, power-up, verify).
#   usage: scripts/main-job.sh [IMAGE]     (default /tmp/warpfs-demo.img, 256 MiB)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${1:-/tmp/warpfs-demo.img}
bash "$repo/scripts/install-deps.sh"
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWARPFS_BUILD_TESTS=ON -DWARPFS_BUILD_BENCH=ON >/dev/null
ninja -C "$repo/build" warpfs-nvme-demo
"$repo/build/nvme/warpfs-nvme-demo" --size $((256 << 20)) "emu:$image"
