#!/usr/bin/env bash
# Installs what warpfs needs, checks the sources' format, builds it three ways and passes
# every test:
#   build/       Release (what users build), all tests, including real FUSE mounts (ctest
#                label mounted), the concurrent stress harnesses and the VFIO guests
#   build-asan/  ASan + UBSan, all tests; the mounted stress runs against the ASan daemon
#   build-tsan/  TSan, the concurrent layers (ctest labels nvme, cache, blockdev), the
#                filesystem core (fs_tests; not the tools that only check the host's tmpfs)
#                and a real mount of the TSan daemon (mounted_fds_tsan_daemon)
# Prints a final "N passed, N failed" line; exits non-zero on any failure.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
bash "$repo/scripts/install-deps.sh" || exit 1

passed=0
failed=0
# run_suite NAME BUILD_DIR CMAKE_ARGS CTEST_ARGS
run_suite() {
  local name=$1 dir=$2 cmake_args=$3 ctest_args=$4 start=$SECONDS
  echo "=== $name: configure and build ($dir)"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  if ! cmake -S "$repo" -B "$dir" -G Ninja $cmake_args >"$dir/configure.log" 2>&1; then
    cat "$dir/configure.log"; echo "$name: configure failed"; failed=$((failed + 1)); return
  fi
  if ! ninja -C "$dir" -j "$jobs"; then
    echo "$name: build failed"; failed=$((failed + 1)); return
  fi
  echo "=== $name: test (built in $((SECONDS - start)) s)"
  local log="$dir/ctest.log"
  # shellcheck disable=SC2086
  (cd "$dir" && ctest -j "$jobs" --output-on-failure --timeout 600 $ctest_args) 2>&1 | tee "$log"
  local total fails
  total=$(grep -Eo 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  fails=$(grep -Eo '[0-9]+ tests failed out of' "$log" | grep -Eo '^[0-9]+' | tail -1)
  if [[ -z $total ]]; then
    echo "$name: ctest printed no summary"; failed=$((failed + 1)); return
  fi
  passed=$((passed + total - fails))
  failed=$((failed + fails))
  echo "=== $name: $((total - fails)) passed, $fails failed, $((SECONDS - start)) s in all"
}

# The sources as the checked-in .clang-format lays them out (clang-format 14, Debian 12's);
# `git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i` fixes them.
run_format() {
  echo "=== format: clang-format --dry-run --Werror"
  local files
  mapfile -t files < <(cd "$repo" && git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null)
  if ((${#files[@]} == 0)); then echo "format: not a git checkout, not checked"; return; fi
  if (cd "$repo" && clang-format --dry-run --Werror "${files[@]}"); then
    echo "format: ${#files[@]} files as .clang-format has them"; passed=$((passed + 1))
  else
    echo "format: the files above differ from .clang-format"; failed=$((failed + 1))
  fi
}
run_format

run_suite "release" "$repo/build" "-DCMAKE_BUILD_TYPE=Release -DWARPFS_BUILD_BENCH=ON" ""
run_suite "asan+ubsan" "$repo/build-asan" \
  "-DCMAKE_BUILD_TYPE=Debug -DWARPFS_SANITIZE=address -DWARPFS_BUILD_BENCH=OFF" ""
run_suite "tsan" "$repo/build-tsan" \
  "-DCMAKE_BUILD_TYPE=RelWithDebInfo -DWARPFS_SANITIZE=thread -DWARPFS_BUILD_BENCH=OFF" \
  "-L nvme|cache|blockdev|fs -E posix_on_tmpfs|persist_on_tmpfs|fsx_"

# libFuzzer targets (tests/fuzz/run.sh): a clang build in build-fuzz/, each target fuzzed for
# a bounded time, the seed and regression corpora replayed; its last line is "N passed, N failed".
run_fuzz() {
  local start=$SECONDS
  echo "=== fuzz: tests/fuzz/run.sh"
  mkdir -p "$repo/build-fuzz"
  local log="$repo/build-fuzz/run.log" line
  bash "$repo/tests/fuzz/run.sh" 2>&1 | tee "$log"
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
  if [[ -z $line ]]; then
    echo "fuzz: run.sh printed no summary"; failed=$((failed + 1)); return
  fi
  passed=$((passed + $(cut -d' ' -f1 <<<"$line")))
  failed=$((failed + $(cut -d' ' -f3 <<<"$line")))
  echo "=== fuzz: $((SECONDS - start)) s"
}
# Each target fuzzed 50 s after its seeds, then the regression corpus (about 3 min plus the
# clang build); soak by hand: bash tests/fuzz/run.sh --soak
run_fuzz

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
