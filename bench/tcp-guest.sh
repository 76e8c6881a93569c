#!/usr/bin/env bash
# bench/tcp-guest.sh: the NVMe/TCP transport measured in the QEMU guest of
# tests/vfio/run-guest.sh tcp (the kernel's nvmet-tcp target on loopback), not a CI test.
#   usage: bench/tcp-guest.sh BUILD_DIR OUT_STEM [SECONDS_PER_POINT]
# BUILD_DIR holds mkfs.warpfs, fsck.warpfs, warpfs and warpfs-bench-blockread (bench/run tcp
# builds them). In the guest, random 4 KiB reads with 1 thread (QD1 latency) and 32 threads
# (one read in flight each: QD32 IOPS) from
#   driver-tcp  warpfs's own driver on namespace 2 (a RAM disk) over NVMe/TCP,
#   kernel-tcp  the kernel's nvme-tcp initiator on the same namespace (its block device),
#   warpfs-tcp  a file on a warpfs mount over NVMe/TCP (namespace 1), cache_mb=0, O_DIRECT,
#   warpfs-emu  the same on a warpfs mount over the emulated controller (image in tmpfs).
# Writes OUT_STEM.jsonl: the measurements, then one line per comparison with its ratios:
# driver-tcp / kernel-tcp and warpfs-tcp / warpfs-emu (latency ratio below 1: the first is
# faster; IOPS ratio above 1: the first is faster). The guest is TCG-emulated on one vCPU of a
# 2-core host: the figures mean something only beside each other, within one run.
set -euo pipefail

(($# >= 2)) || { echo "usage: $0 BUILD_DIR OUT_STEM [SECONDS_PER_POINT]" >&2; exit 2; }
build=$1
stem=$2
seconds=${3:-5}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log=$stem.console.log

rc=0
WARPFS_VM_LOG=$log WARPFS_VM_APPEND="warpfs.bench=1 warpfs.bench_s=$seconds ${WARPFS_VM_APPEND:-}" \
  bash "$repo/tests/vfio/run-guest.sh" tcp "$build" || rc=$?

tr -d '\r' <"$log" | sed -n 's/^.*WARPFS-BENCH \({.*}\)$/\1/p' >"$stem.jsonl"
info=$(tr -d '\r' <"$log" | sed -n 's/^.*WARPFS-BENCH-INFO \({.*}\)$/\1/p' | head -1)
python3 - "$stem.jsonl" "${info:-{\}}" <<'EOF'
import json, sys
path, info = sys.argv[1], json.loads(sys.argv[2])
rows = [json.loads(l) for l in open(path) if l.strip()]
by = {(r["label"], r["threads"]): r for r in rows}
out = []
for a, b in (("driver-tcp", "kernel-tcp"), ("warpfs-tcp", "warpfs-emu")):
    one_a, one_b = by.get((a, 1)), by.get((b, 1))
    many_a, many_b = by.get((a, 32)), by.get((b, 32))
    if not (one_a and one_b and many_a and many_b):
        continue
    out.append({
        "bench": "blockread-ratio", "a": a, "b": b, **info,
        "qd1_p50_latency_ratio": round(one_a["lat_p50_us"] / one_b["lat_p50_us"], 3),
        "qd1_mean_latency_ratio": round(one_a["lat_mean_us"] / one_b["lat_mean_us"], 3),
        "qd32_iops_ratio": round(many_a["iops"] / many_b["iops"], 3),
    })
with open(path, "a") as f:
    for o in out:
        f.write(json.dumps(o) + "\n")
for r in rows:
    print("%-11s threads %2d  %9.0f IOPS  p50 %8.1f us  p99 %8.1f us  mean %8.1f us" %
          (r["label"], r["threads"], r["iops"], r["lat_p50_us"], r["lat_p99_us"], r["lat_mean_us"]))
for o in out:
    print("%s / %s: QD1 p50 latency x%.3f, QD1 mean latency x%.3f, QD32 IOPS x%.3f" %
          (o["a"], o["b"], o["qd1_p50_latency_ratio"], o["qd1_mean_latency_ratio"], o["qd32_iops_ratio"]))
EOF
echo "bench/tcp-guest.sh: results in $stem.jsonl, the guest's console in $log" >&2
exit "$rc"
