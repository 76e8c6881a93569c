#!/usr/bin/env bash
# Replays crash/hang inputs and groups them by signature: the broken promise, or the
# sanitizer's report with the first stack frame in warpfs code (not the harness).
#   tests/fuzz/triage.sh TARGET FILE_OR_DIR...     e.g. triage.sh fuzz_mount build-fuzz/artifacts/fuzz_mount
# Prints "count  signature  one-input" per group, most frequent first.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=$1
shift
bin="${FUZZ_BUILD:-$repo/build-fuzz}/tests/fuzz/$target"
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
declare -A count example
while IFS= read -r -d '' f; do
  out=$(timeout 120 "$bin" -timeout=30 -runs=1 "$f" 2>&1)
  rc=$?
  ((rc == 0)) && { sig="(passes now)"; count[$sig]=$((${count[$sig]:-0} + 1)); example[$sig]=$f; continue; }
  sig=$(grep -m1 -o 'promise broken: .*' <<<"$out" | cut -c1-160)
  if [[ -z $sig ]]; then
    what=$(grep -m1 -Eo 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+( on [a-z]+)?|runtime error: .*' <<<"$out" | cut -c1-100)
    frame=$(grep -E '^ +#[0-9]+ 0x[0-9a-f]+ in .*/(fs|nvme|blockdev|cache)/src/' <<<"$out" | head -1 |
            sed -E 's/.* in ([^(]+)\(.* ([^ ]+:[0-9]+):[0-9]+$/\1 \2/; s|[^ ]*/(fs\|nvme\|blockdev\|cache)/src/|\1/src/|')
    sig="${what:-exit $rc} @ ${frame:-?}"
  fi
  count[$sig]=$((${count[$sig]:-0} + 1))
  example[$sig]=$f
done < <(find "$@" -type f -print0)
for sig in "${!count[@]}"; do printf '%5d  %s  %s\n' "${count[$sig]}" "$sig" "${example[$sig]}"; done | sort -rn
