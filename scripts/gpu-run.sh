#!/usr/bin/env bash
# scripts/gpu-run.sh: builds the GPU engine and runs its tests and benchmarks in one go, for
# one call on the GPU machine (device time is scarce: build, test and measure together).
#
#   scripts/gpu-run.sh [STEP...]     steps, in the order given (default: tests sanitize bench
#                                    bfs-files)
#     tests      the GPU test programs (tests/gpu), full size
#     sanitize   the same at --small under compute-sanitizer memcheck and racecheck
#     bench      the GPU benchmarks (BENCHES="bfs queues cache" by default; a subset picks
#                them); JSON lines into $OUT (or bench/results/tmp) as gpu-<bench>.jsonl
#     info       the device, driver and what the host-mapped memory path supports
#     bfs-files  BFS from files: mkfs.warpfs and the warpfs daemon (WARPFS_GPU_DEPS/bin, built on
#                a Debian machine: scripts/gpu-deps.sh DEST BUILD) format an image and mount
#                it; the benchmark writes its graphs into the mount as files (--write-graph),
#                the mount goes, and the BFS runs over the image's files through gpu::Volume
#                beside the in-memory and raw-namespace runs (--image); gpu-bfs-files.jsonl
#
# Builds Release into build-gpu/ and only the targets the steps need. The GPU machine has no
# libfuse3, xxHash, oneTBB or libpci: the filesystem core (for gpu::Volume and
# gpu_volume_test) is built when WARPFS_GPU_DEPS (default .dev/usr, made by
# scripts/gpu-deps.sh on a Debian machine and carried along) holds xxhash.h and oneTBB;
# without it, -DWARPFS_BUILD_FS=OFF and the volume test is left out (said so). The daemon and
# the tools are never built there (-DWARPFS_BUILD_FS_PROGRAMS=OFF). Prints "N passed, N
# failed" last; exits non-zero on any failure.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build-gpu"
out="${OUT:-$repo/bench/results/tmp}"
mkdir -p "$out"
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tests sanitize bench bfs-files)
jobs=$(nproc)
passed=0
failed=0
tests=(gpu_io_test gpu_cache_test)
deps=${WARPFS_GPU_DEPS:-$repo/.dev/usr}
fs_args=(-DWARPFS_BUILD_FS=OFF)
if [[ -f $deps/include/xxhash.h && -d $deps/lib/x86_64-linux-gnu/cmake/TBB ]]; then
  fs_args=(-DWARPFS_BUILD_FS=ON -DWARPFS_BUILD_FS_PROGRAMS=OFF "-DXXHASH_INCLUDE_DIR=$deps/include"
    "-DTBB_DIR=$deps/lib/x86_64-linux-gnu/cmake/TBB")
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  tests+=(gpu_volume_test)
else
  echo "note: no xxhash.h/oneTBB in $deps (scripts/gpu-deps.sh): the filesystem core and gpu_volume_test are not built"
fi
benches=()
for b in ${BENCHES:-bfs queues cache}; do benches+=("warpfs-bench-gpu-$b"); done
[[ " ${steps[*]} " == *" bfs-files "* && " ${benches[*]} " != *" warpfs-bench-gpu-bfs "* ]] &&
  benches+=(warpfs-bench-gpu-bfs)

generator="Unix Makefiles"
command -v ninja >/dev/null && generator=Ninja
echo "=== configure ($build)"
if ! cmake -S "$repo" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    "${fs_args[@]}" -DWARPFS_CUDA=ON -DWARPFS_BUILD_TESTS=ON -DWARPFS_BUILD_BENCH=ON \
    >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; echo "0 passed, 1 failed"; exit 1
fi
echo "=== build"
start=$(date +%s)
if ! cmake --build "$build" -j "$jobs" --target "${tests[@]}" "${benches[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40; echo "0 passed, 1 failed"; exit 1
fi
echo "built in $(( $(date +%s) - start )) s"

record() {  # record NAME RC
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "--- $1: passed"
  else failed=$((failed + 1)); echo "--- $1: FAILED (exit $2)"; fi
}

for step in "${steps[@]}"; do
  case $step in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv || true
      nvcc --version | tail -1
      ;;
    tests)
      for t in "${tests[@]}"; do
        echo "=== $t"
        timeout 300 "$build/gpu/$t"; record "$t" $?
      done
      # The GPU's writes read back through a FUSE mount (the daemon from WARPFS_GPU_DEPS/bin).
      if [[ " ${tests[*]} " == *" gpu_volume_test "* && -x $deps/bin/warpfs ]]; then
        echo "=== gpu_volume_test, then the image through a FUSE mount"
        keep=$(mktemp -d "${TMPDIR:-/tmp}/warpfs-volume.XXXXXX")
        timeout 300 "$build/gpu/gpu_volume_test" --keep "$keep" >"$out/volume-keep.log" 2>&1
        rc=$?
        if [[ $rc -eq 0 ]]; then
          mkdir -p "$keep/mnt"
          "$deps/bin/warpfs" -f -o ro "$keep/volume.img" "$keep/mnt" & daemon=$!
          for _ in $(seq 100); do mountpoint -q "$keep/mnt" && break; sleep 0.1; done
          for f in "$keep"/expected/*; do
            n=$(basename "$f")
            m=$(find "$keep/mnt" -name "$n" -type f | head -1)
            if [[ -z $m ]] || ! cmp "$f" "$m"; then echo "differs: $n"; rc=1; else echo "same: ${m#"$keep"/mnt}"; fi
          done
          umount "$keep/mnt"; wait "$daemon"
        fi
        rm -rf "$keep"
        record "gpu_volume_test through FUSE" "$rc"
      fi
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        for t in "${tests[@]}"; do
          echo "=== compute-sanitizer --tool $tool $t --small"
          timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 99 "$build/gpu/$t" --small \
            >"$out/sanitize-$tool-$t.log" 2>&1
          rc=$?
          tail -5 "$out/sanitize-$tool-$t.log"
          record "$tool $t" $rc
        done
      done
      ;;
    bench)
      for b in "${benches[@]}"; do
        echo "=== $b"
        timeout 250 "$build/gpu/$b" ${BENCH_ARGS:-} | tee "$out/${b#warpfs-bench-}.jsonl"; record "$b" "${PIPESTATUS[0]}"
      done
      ;;
    bfs-files)
      bin=$deps/bin
      bench_bin=$build/gpu/warpfs-bench-gpu-bfs
      img=${TMPDIR:-/tmp}/warpfs-bfs-files.img
      mnt=${TMPDIR:-/tmp}/warpfs-bfs-files.mnt
      if [[ ! -x $bin/warpfs || ! -x $bin/mkfs.warpfs ]]; then
        echo "--- bfs-files: skipped (no warpfs daemon in $bin: scripts/gpu-deps.sh DEST BUILD)"; continue
      fi
      rm -f "$img"; mkdir -p "$mnt"
      "$bin/mkfs.warpfs" -q --size "${BFS_IMAGE_SIZE:-3G}" "$img" &&
        { "$bin/warpfs" -f "$img" "$mnt" & daemon=$!; } &&
        for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
      mkdir -p "$mnt/bfs"
      "$bench_bin" ${BENCH_ARGS:-} --write-graph "$mnt/bfs" | tee "$out/gpu-bfs-files.jsonl"
      rc=${PIPESTATUS[0]}
      umount "$mnt"; wait "$daemon"
      "$bin/fsck.warpfs" -n -f "$img" | tail -1
      if [[ $rc -eq 0 ]]; then
        timeout 400 "$bench_bin" ${BENCH_ARGS:-} --image "$img" | tee -a "$out/gpu-bfs-files.jsonl"
        rc=${PIPESTATUS[0]}
      fi
      rm -f "$img"
      record bfs-files "$rc"
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
