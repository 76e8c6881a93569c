#!/usr/bin/env bash
# Packs what bench/fs/run.sh and the A/B scripts need into one directory that can travel to a
# machine with no package archive and none of warpfs's libraries (the 16-core device machine:
# Ubuntu, no libfuse3, fio, libpci, oneTBB or xxHash), and writes a runner beside it.
#
#   bench/fs/carry.sh BUILD DIR
#     BUILD  a Release build directory with the daemon, mkfs, warpfs-stat, warpfs-bench-meta
#            and warpfs-null built (bench/run fs builds build-bench/)
#     DIR    created (emptied first): DIR/b/ a build-directory layout of wrappers, DIR/bin/
#            fio and fusermount3 wrappers, DIR/lib.tar.xz their shared libraries (those of
#            this machine, compressed: fio's optional engines pull in about 80 MiB), DIR/run
# On the other machine, from the repository's root:
#   DIR/run bench/fs/run.sh --build DIR/b --out STEM --quick ...
#   DIR/run bench/fs/ab_direct.sh DIR/b/fs/daemon/warpfs DIR/b/fs/daemon/warpfs 4
# DIR/run unpacks the libraries into /tmp/warpfs-carried-lib, puts DIR/bin first on PATH and
# sets MKFS, WARPFS, NULL and PLL for the A/B scripts, then runs its arguments. Each program
# is a wrapper that sets LD_LIBRARY_PATH for itself alone (exec: same pid, so run.sh's CPU
# accounting sees the daemon), so the other machine's own tools (python3) keep their own
# libraries. passthrough_ll is built here from libfuse's example source.
set -euo pipefail
(($# == 2)) || { sed -n 2,20p "$0" >&2; exit 2; }
build=$(cd "$1" && pwd)
dir=$2
pll_src=/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c
progs=(fs/daemon/warpfs fs/daemon/warpfs-stat mkfs/mkfs.warpfs bench/warpfs-bench-meta
       bench/warpfs-null)
for p in "${progs[@]}"; do
  [[ -x $build/$p ]] || { echo "carry: $build/$p is not built" >&2; exit 1; }
done
for t in fio fusermount3 cc pkg-config xz; do
  command -v "$t" >/dev/null || { echo "carry: $t not found (scripts/install-deps.sh)" >&2; exit 1; }
done
[[ -r $pll_src ]] || { echo "carry: $pll_src missing (apt-get install libfuse3-dev)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"/b/fs/daemon "$dir"/b/mkfs "$dir"/b/bench "$dir"/bin "$dir"/lib
dir=$(cd "$dir" && pwd)
for p in "${progs[@]}"; do cp "$build/$p" "$dir/b/$p.real"; done
# shellcheck disable=SC2046  # pkg-config's flags are words
cc -O2 -o "$dir/b/bench/passthrough_ll.real" "$pll_src" $(pkg-config fuse3 --cflags --libs)
cp "$(command -v fio)" "$dir/bin/fio.real"
cp "$(command -v fusermount3)" "$dir/bin/fusermount3.real"
reals=("$dir"/b/*/*.real "$dir"/b/fs/daemon/*.real "$dir"/bin/*.real)
# The libraries the programs load, less the C and C++ runtimes every Linux machine has.
for f in "${reals[@]}"; do
  ldd "$f" | awk '/=> \// { print $3 }'
done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
  while read -r l; do cp -L "$l" "$dir/lib/"; done
tar -C "$dir" -cJf "$dir/lib.tar.xz" lib
rm -rf "$dir/lib"
for f in "${reals[@]}"; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/warpfs-carried-lib exec "$0.real" "$@"\n' >"${f%.real}"
  chmod +x "${f%.real}"
done
cat >"$dir/run" <<'EOF'
#!/usr/bin/env bash
# Runs its arguments with the carried programs (bench/fs/carry.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/warpfs-carried-lib
tar -C /tmp/warpfs-carried-lib --strip-components=1 -xJf "$here/lib.tar.xz"
export PATH=$here/bin:$PATH
export MKFS=$here/b/mkfs/mkfs.warpfs WARPFS=$here/b/fs/daemon/warpfs
export NULL=$here/b/bench/warpfs-null PLL=$here/b/bench/passthrough_ll
exec "$@"
EOF
chmod +x "$dir/run"
du -sh "$dir"
