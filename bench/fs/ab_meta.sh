#!/usr/bin/env bash
# The metadata rows of `bench/run fs` alone (warpfs-bench-meta, flat and tree), warpfs against
# libfuse's passthrough_ll over a tmpfs, side by side on one machine, ROUNDS rounds whose
# order rotates so that the machine's noise falls on every filesystem alike. Optionally a
# second warpfs build (an A/B of a change) and passthrough_ll with -o default_permissions
# (the kernel's permission checks, as warpfs has them: see bench/results/meta-*.md).
#   usage: ab_meta.sh BUILD_A [BUILD_B]       (build directories with warpfs, mkfs.warpfs,
#          warpfs-stat and warpfs-bench-meta built; run as root)
#   env:   ROUNDS (3), FILES (10000), LAYOUTS ("flat tree"), PLL_PERM=1 (add pll_perm),
#          PLL (passthrough_ll binary; default BUILD_A/bench/passthrough_ll, built from
#          Debian's example source when missing), TMPDIR (default /dev/shm)
# Prints JSON lines: warpfs-bench-meta's, each with "fs" (pll, pll_perm, A, B) and "round";
# for A and B one "requests" line per run: the FUSE requests the daemon served during it
# (warpfs-stat's op counts), so that requests per operation can be read beside the rates.
# Then one "ratio" line per row and filesystem: the median over rounds against pll.
set -u
(($# >= 1)) || { sed -n 2,15p "$0" >&2; exit 2; }
declare -A build=([A]=$1)
[[ -n ${2:-} ]] && build[B]=$2
rounds=${ROUNDS:-3}
files=${FILES:-10000}
layouts=${LAYOUTS:-flat tree}
tmp=${TMPDIR:-/dev/shm}
meta=$1/bench/warpfs-bench-meta
pll=${PLL:-$1/bench/passthrough_ll}
pll_src=/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c
if [[ ! -x $pll ]]; then
  # shellcheck disable=SC2046  # pkg-config's flags are words
  cc -O2 -o "$pll" "$pll_src" $(pkg-config fuse3 --cflags --libs) || exit 1
fi
work=$(mktemp -d "$tmp/ab-meta.XXXXXX")
declare -A pid mnt
cleanup() {
  local f
  for f in "${!mnt[@]}"; do mountpoint -q "${mnt[$f]}" && fusermount3 -u "${mnt[$f]}"; done
  for f in "${!pid[@]}"; do wait "${pid[$f]}" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start() {  # FS CMD... (the mountpoint is appended)
  local f=$1
  shift
  mnt[$f]=$work/mnt-$f
  mkdir -p "${mnt[$f]}"
  "$@" "${mnt[$f]}" >"$work/$f.log" 2>&1 &
  pid[$f]=$!
  for _ in $(seq 100); do mountpoint -q "${mnt[$f]}" && return 0; sleep 0.1; done
  cat "$work/$f.log" >&2
  exit 1
}
fses=(pll)
mkdir -p "$work/src-pll"
start pll "$pll" -f -o "source=$work/src-pll"
if [[ -n ${PLL_PERM:-} ]]; then
  mkdir -p "$work/src-pll_perm"
  start pll_perm "$pll" -f -o default_permissions -o "source=$work/src-pll_perm"
  fses+=(pll_perm)
fi
for v in A B; do
  [[ -n ${build[$v]:-} ]] || continue
  # The size bench/run fs gives every filesystem (2 x 1 GiB fio file + 1 GiB).
  "${build[$v]}/mkfs/mkfs.warpfs" -q --size 3072M "emu:$work/$v.img" || exit 1
  start "$v" "${build[$v]}/fs/daemon/warpfs" -f -o latency_us=0 "emu:$work/$v.img"
  fses+=("$v")
done
requests() {  # FS: warpfs-stat's op counts as one JSON object
  "${build[$1]}/fs/daemon/warpfs-stat" --json "${mnt[$1]}" |
    python3 -c 'import json,sys; print(json.dumps({k: v["count"] for k, v in json.load(sys.stdin)["ops"].items()}))'
}
for ((r = 0; r < rounds; ++r)); do
  for layout in $layouts; do
    n=${#fses[@]}
    for ((k = 0; k < n; ++k)); do
      f=${fses[$(((k + r) % n))]}
      args=(--dir "${mnt[$f]}" --files "$files" --pid "${pid[$f]}")
      [[ $layout == tree ]] && args+=(--tree)
      [[ -n ${build[$f]:-} ]] && before=$(requests "$f")
      "$meta" "${args[@]}" | sed "s/^{/{\"fs\":\"$f\",\"round\":$r,/" | tee -a "$work/all.jsonl"
      if [[ -n ${build[$f]:-} ]]; then
        python3 -c 'import json,sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
d = {k: b[k] - a.get(k, 0) for k in b if b[k] != a.get(k, 0)}
print(json.dumps({"fs": sys.argv[3], "round": int(sys.argv[4]), "layout": sys.argv[5],
                  "files": int(sys.argv[6]), "requests": d}))' "$before" "$(requests "$f")" \
          "$f" "$r" "$layout" "$files"
      fi
    done
  done
done
python3 - "$work/all.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for key in dict.fromkeys((r["layout"], r["op"]) for r in rows):
    rate = {}
    for r in rows:
        if (r["layout"], r["op"]) == key:
            rate.setdefault(r["fs"], []).append(r["ops_per_s"])
    for fs, v in rate.items():
        if fs != "pll" and "pll" in rate:
            print(json.dumps({"ratio": fs + "/pll", "workload": "meta_%s_%s" % key,
                              "value": round(statistics.median(v) / statistics.median(rate["pll"]), 3),
                              "rounds": [round(a / b, 2) for a, b in zip(v, rate["pll"])]}))
EOF
