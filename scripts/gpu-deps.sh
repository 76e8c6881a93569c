#!/usr/bin/env bash
# scripts/gpu-deps.sh [DEST [BUILD]]: packs what the filesystem core needs to build on the GPU machine
# (which has CUDA, CMake, GoogleTest, but no xxHash or oneTBB and no package archive) from
# this Debian machine's packages into DEST (default .dev/usr, git-ignored, carried to the GPU
# machine): xxhash.h (the core uses xxHash header-only), oneTBB's headers, CMake package
# files and libraries (fsck's parallel passes). scripts/gpu-run.sh finds them there
# (WARPFS_GPU_DEPS) and then builds gpu::Volume and gpu_volume_test too. With BUILD (a build
# directory of this machine), also the daemon and mkfs.warpfs/fsck.warpfs with libfuse3 and
# libpci into DEST/bin and DEST/lib, for gpu-run.sh's bfs-files step (a FUSE mount there).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$repo/.dev/usr}
lib=lib/x86_64-linux-gnu
for f in /usr/include/xxhash.h /usr/include/tbb /usr/include/oneapi /usr/$lib/cmake/TBB; do
  [[ -e $f ]] || { echo "gpu-deps: $f is missing (apt-get install libxxhash-dev libtbb-dev)" >&2; exit 2; }
done
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/$lib/cmake"
cp -a /usr/include/xxhash.h /usr/include/tbb /usr/include/oneapi "$dest/include/"
cp -a /usr/$lib/cmake/TBB "$dest/$lib/cmake/"
cp -a /usr/$lib/libtbb*.so* "$dest/$lib/"
if [[ -n ${2:-} ]]; then
  mkdir -p "$dest/bin"
  cp "$2/fs/daemon/warpfs" "$2/mkfs/mkfs.warpfs" "$2/mkfs/fsck.warpfs" "$dest/bin/"
  for l in libfuse3.so.3 libpci.so.3; do cp -L "/$lib/$l" "$dest/$lib/"; done
fi
echo "gpu-deps: $(du -sh "$dest" | cut -f1) in $dest"
