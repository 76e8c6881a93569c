#!/usr/bin/env bash
# Installs the Debian 12 packages warpfs needs to build, test and benchmark.
# Run as root. Idempotent: apt-get skips what is already installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev   # unit tests, micro-benchmarks
  libfuse3-dev fuse3                           # the FUSE daemon
  libpci-dev                                   # naming NVMe controllers for VFIO
  libxxhash-dev                                # metadata checksums
  libtbb-dev                                   # fsck's parallel passes, benchmark baselines
  nlohmann-json3-dev                           # every JSON the programs write
  fio                                          # file benchmarks
  qemu-system-x86 busybox-static cpio kmod     # tests/vfio: the VFIO transport in a QEMU guest
  xz-utils zstd
  groff-base                                   # tests: the man pages render without warnings
  acl                                          # tests: setfacl and getfacl on a mount
  clang libclang-rt-14-dev                     # tests/fuzz: libFuzzer, ASan and UBSan runtimes
  clang-format                                 # tests: the sources as .clang-format has them
  fuse2fs e2fsprogs gnuplot-nox python3        # bench/run fs: fuse2fs, PNG charts, reports
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
