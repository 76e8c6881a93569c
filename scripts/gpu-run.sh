#!/usr/bin/env bash
# scripts/gpu-run.sh: builds the GPU engine and runs its tests and benchmarks in one go, for
# one call on the GPU machine (device time is scarce: build, test and measure together).
#
#   scripts/gpu-run.sh [STEP...]     steps, in the order given (default: tests sanitize bench)
#     tests      the GPU test programs (tests/gpu), full size
#     sanitize   the same at --small under compute-sanitizer memcheck and racecheck
#     bench      the GPU benchmarks (BENCHES="bfs queues cache" by default; a subset picks
#                them); JSON lines into $OUT (or bench/results/tmp) as gpu-<bench>.jsonl
#     info       the device, driver and what the host-mapped memory path supports
#
# Builds Release into build-gpu/ with -DWARPFS_BUILD_FS=OFF (the GPU machine has no libfuse3,
# xxHash, oneTBB or libpci) and only the targets the steps need. Prints "N passed, N failed"
# last; exits non-zero on any failure.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build-gpu"
out="${OUT:-$repo/bench/results/tmp}"
mkdir -p "$out"
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tests sanitize bench)
jobs=$(nproc)
passed=0
failed=0
tests=(gpu_io_test gpu_cache_test)
benches=()
for b in ${BENCHES:-bfs queues cache}; do benches+=("warpfs-bench-gpu-$b"); done

generator="Unix Makefiles"
command -v ninja >/dev/null && generator=Ninja
echo "=== configure ($build)"
if ! cmake -S "$repo" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DWARPFS_BUILD_FS=OFF -DWARPFS_CUDA=ON -DWARPFS_BUILD_TESTS=ON -DWARPFS_BUILD_BENCH=ON \
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
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
