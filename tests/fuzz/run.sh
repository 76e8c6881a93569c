#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ (ASan + UBSan, coverage
# instrumentation), then for each target: replays its seed corpus, fuzzes it for a bounded
# time, and replays every input of its regression corpus one by one. Prints, per target, the
# executions, coverage and crashes, and a final "N passed, N failed" line (one test per seed
# replay, per fuzz run and per regression input); exits non-zero on any failure. The seed
# replay is the fuzz run's start (libFuzzer runs every corpus input before it mutates any,
# and prints INITED when all passed); a soak, which goes on after crashes, replays them first
# on their own.
#
#   tests/fuzz/run.sh [--seconds N] [--soak] [--target NAME] [--no-build]
#     --seconds N   fuzz each target N seconds (default 50: CI)
#     --soak        fuzz each target for an hour (or --seconds N), and keep going after a
#                   crash (libFuzzer -fork=1 -ignore_crashes=1): every crash is saved
#     --target NAME only this target (fuzz_mount, fuzz_fsck, fuzz_nvme, fuzz_tcp_pdu,
#                   fuzz_raid)
#     --no-build    use what build-fuzz/ holds
#
# The working corpus grows in build-fuzz/corpus/<target> (kept between runs: a soak
# continues where the last run stopped); crashes, hangs and OOMs land in
# build-fuzz/artifacts/<target>/. tests/fuzz/README.md says how to triage one.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$repo/tests/fuzz"
build="$repo/build-fuzz"
seconds=50
soak=0
build_it=1
targets=(fuzz_mount fuzz_fsck fuzz_nvme fuzz_tcp_pdu fuzz_raid)
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --soak) soak=1; [[ $seconds == 50 ]] && seconds=3600; shift ;;
    --target) targets=("$2"); shift 2 ;;
    --no-build) build_it=0; shift ;;
    *) echo "usage: $0 [--seconds N] [--soak] [--target NAME] [--no-build]" >&2; exit 16 ;;
  esac
done
[[ $soak == 1 && $seconds == 50 ]] && seconds=3600

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAILED: $*"; }

if ((build_it)); then
  echo "=== fuzz: configure and build ($build, clang)"
  mkdir -p "$build"
  if ! command -v clang++ >/dev/null; then
    echo "clang++ not found (scripts/install-deps.sh installs clang)"; echo "0 passed, 1 failed"; exit 1
  fi
  if ! CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DWARPFS_SANITIZE=address -DWARPFS_FUZZ=ON -DWARPFS_BUILD_TESTS=OFF -DWARPFS_BUILD_BENCH=OFF \
      >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"; echo "0 passed, 1 failed"; exit 1
  fi
  if ! ninja -C "$build" "${targets[@]}"; then
    echo "0 passed, 1 failed"; exit 1
  fi
fi

# Per-target libFuzzer options: input size, dictionary.
opts_for() {
  case $1 in
    fuzz_mount | fuzz_fsck) echo "-max_len=1024 -dict=$here/image.dict" ;;
    fuzz_nvme) echo "-max_len=2048" ;;
    fuzz_tcp_pdu) echo "-max_len=4096" ;;
    fuzz_raid) echo "-max_len=512" ;;
  esac
}
# Per-target fuzzing time: the PDU parser is small and fast (its coverage saturates within
# seconds), so CI gives it at most 20 s of the run's budget; a soak gives it the full time.
seconds_for() {
  if [[ $1 == fuzz_tcp_pdu && $soak == 0 && $seconds -gt 20 ]]; then echo 20; else echo "$seconds"; fi
}
# ASan: report leaks too; UBSan: a stack with each report (libFuzzer sets the rest).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
common=(-timeout=30 -rss_limit_mb=3072 -print_final_stats=1)

summary=()
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/$t"
  [[ -x $bin ]] || { fail "$t: $bin not built"; continue; }
  seeds="$here/corpus/$t"
  regress="$here/regress/$t"
  work="$build/corpus/$t"
  art="$build/artifacts/$t"
  mkdir -p "$work" "$art"
  log="$build/$t.log"
  # shellcheck disable=SC2046
  read -r -a extra <<<"$(opts_for "$t")"

  if ((soak)); then
    echo "=== $t: seed corpus replay"
    if "$bin" "${common[@]}" "${extra[@]}" -runs=0 "$seeds" >"$log.seeds" 2>&1; then
      pass
    else
      tail -40 "$log.seeds"; fail "$t: the seed corpus crashes (see $log.seeds)"
    fi
  fi

  tsec=$(seconds_for "$t")
  echo "=== $t: seed and working corpus replay, then fuzzing for $tsec s"
  before=$(find "$art" -type f | wc -l)
  fork=()
  ((soak)) && fork=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  "$bin" "${common[@]}" "${extra[@]}" "${fork[@]}" -max_total_time="$tsec" \
    -artifact_prefix="$art/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  if ((!soak)); then
    if grep -Eq '^#[0-9]+[[:space:]]+INITED' "$log"; then
      pass
    else
      grep -E 'promise broken|ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|SUMMARY' "$log" | head -10
      fail "$t: an input of $seeds or $work crashes (see $log)"
    fi
  fi
  after=$(find "$art" -type f | wc -l)
  crashes=$((after - before))
  execs=$(grep -Eo 'stat::number_of_executed_units: +[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  if [[ -z $execs ]]; then  # fork mode, or the run died: the last status line
    execs=$(grep -Eo '^#[0-9]+' "$log" | tr -d '#' | tail -1)
  fi
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  rate=$(grep -Eo 'stat::average_exec_per_sec: +[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  [[ -z $rate ]] && rate=$(grep -Eo 'exec/s:? [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  if ((rc == 0 && crashes == 0)); then
    pass
  else
    grep -E 'promise broken|ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|SUMMARY' "$log" | head -10
    fail "$t: $crashes new crash/hang input(s) in $art (exit $rc; log $log)"
  fi

  echo "=== $t: regression corpus replay"
  nreg=0
  nbad=0
  if [[ -d $regress ]]; then
    for f in "$regress"/*; do
      [[ -f $f ]] || continue
      nreg=$((nreg + 1))
      if "$bin" "${common[@]}" "${extra[@]}" -runs=1 "$f" >"$log.regress" 2>&1; then
        pass
      else
        nbad=$((nbad + 1))
        grep -E 'promise broken|ERROR: (AddressSanitizer|libFuzzer)|runtime error' "$log.regress" | head -3
        fail "$t: regression input $(basename "$f") still fails"
      fi
    done
  fi
  summary+=("$t: ${execs:-0} executions (${rate:-?}/s) in $tsec s, cov ${cov:-?}, $crashes new crash(es); regression corpus: $((nreg - nbad))/$nreg pass")
done

echo "=== fuzz summary"
for s in "${summary[@]}"; do echo "$s"; done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
