#!/usr/bin/env python3
"""bench/fs/report.py: the JSON lines, ratios and charts of `bench/run fs` (bench/fs/run.sh).

Subcommands (each prints JSON lines on stdout; see bench/README.md, "## fs"):
  info --fields JSON [--key K]            the run's settings (K: info, or info_end)
  idle --fs F --idle-s S --ticks T --tck HZ --ctx N [--fields JSON]
                                          a daemon's CPU while mounted and idle
  fio --fs F --workload W --io IO --metric M --ticks T|null --tck HZ --error E --json FILE
      --fields JSON [--fs-fields JSON] [--window measured|job]
                                          one fio job's result (job: the CPU was sampled over
                                          fio's whole run, whose job_runtime is the seconds)
  meta --fs F --layout L --error E [--fields JSON] < warpfs-bench-meta output
The --fields of idle and meta, and --fs-fields of fio, are added to every line (warpfs's
emulated device latency).
  ratios RESULTS.jsonl                    ratio lines between filesystems, per workload
  charts RESULTS.jsonl STEM               STEM-*.png through gnuplot (prints the file names)
  table RESULTS.jsonl                     a Markdown table: value per filesystem and ratios
A run of several rounds (run.sh --rounds) has each measured line once a round, with its
"round": a workload's value is then the median of its rounds', and a ratio the median of each
round's ratio (the two runs of one round were close together in time, so the machine's noise
of that moment fell on both), with the rounds' ratios beside it.
Only the standard library.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# (numerator, denominator) of the ratio lines, written where both measured the workload:
# warpfs against passthrough_ll, against the FUSE ceiling (null: warpfs-null, no storage)
# and, for the durability rows, against the kernel's ext4 on a loop device; the charts show
# the first five present.
RATIO_PAIRS = [
    ("warpfs", "passthrough_ll"),
    ("warpfs", "null"),
    ("warpfs", "ext4_loop"),
    ("warpfs", "fuse2fs"),
    ("warpfs", "tmpfs"),
    ("warpfs_ssd", "warpfs"),
    ("warpfs_ssd", "passthrough_ll"),
    ("warpfs_ssd", "null"),
    ("warpfs_ssd", "ext4_loop"),
    ("passthrough_ll", "null"),
    ("passthrough_ll", "ext4_loop"),
    ("passthrough_ll", "tmpfs"),
    ("warpfs_watched", "warpfs"),  # what the live view costs (--fs ...,warpfs_watched)
    ("warpfs_wb", "warpfs"),  # what the kernel's writeback cache gives (--fs ...,warpfs_wb)
    ("warpfs_wb", "passthrough_ll"),
    ("warpfs", "passthrough_ll_dp"),  # metadata on equal terms: both with default_permissions
    ("warpfs_uring", "warpfs"),  # what FUSE over io_uring gives (--fs ...,warpfs_uring)
    ("null_uring", "null"),  # the same for the transport's ceiling (--fs ...,null_uring)
    ("warpfs_uring", "passthrough_ll"),
    ("warpfs_uring", "null_uring"),
]
# The ratio columns of `table`, where both filesystems are in the run.
TABLE_PAIRS = [("warpfs", "passthrough_ll"), ("warpfs", "null"), ("warpfs", "ext4_loop"),
               ("warpfs_ssd", "passthrough_ll"), ("warpfs_ssd", "null"),
               ("warpfs_ssd", "ext4_loop"), ("warpfs_wb", "warpfs"),
               ("warpfs_wb", "passthrough_ll"), ("warpfs", "passthrough_ll_dp"),
               ("warpfs_uring", "warpfs"), ("null_uring", "null"),
               ("warpfs_uring", "passthrough_ll")]
FS_ORDER = ["warpfs", "warpfs_ssd", "warpfs_watched", "warpfs_wb", "warpfs_uring",
            "passthrough_ll", "passthrough_ll_dp", "null", "null_uring", "fuse2fs", "ext4_loop",
            "tmpfs"]


def emit(obj):
    print(json.dumps(obj, separators=(",", ":")))


def rounded(x, digits=3):
    if x is None:
        return None
    return float(f"{x:.{digits}g}") if abs(x) < 1e6 else round(x)


def ticks_to_s(ticks, tck):
    return None if ticks in (None, "null", "") else int(ticks) / float(tck)


def cpu_per_unit_us(cpu_s, value, seconds):
    """Daemon CPU microseconds per op (iops, ops_per_s) or per MB (mb_per_s)."""
    if cpu_s is None or not value or not seconds:
        return None
    return cpu_s * 1e6 / (value * seconds)


def cmd_info(a):
    emit({"bench": "fs", a.key: json.loads(a.fields)})


def cmd_idle(a):
    cpu_s = ticks_to_s(a.ticks, a.tck)
    emit({"bench": "fs", "fs": a.fs, "workload": "idle", "metric": "cpu_percent",
          "value": rounded(100.0 * cpu_s / a.idle_s), "cpu_s": cpu_s, "idle_s": a.idle_s,
          "wakeups_per_s": rounded(a.ctx / a.idle_s), **json.loads(a.fields)})


def cmd_fio(a):
    fields = json.loads(a.fields)
    line = {"bench": "fs", "fs": a.fs, "workload": a.workload, "metric": a.metric,
            "value": None, "cpu_s": ticks_to_s(a.ticks, a.tck)}
    try:
        with open(a.json) as f:
            text = f.read()
        # fio may print notes before the JSON object.
        job = json.loads(text[text.index("{"):])["jobs"][0]
        if job.get("error"):
            raise ValueError(f"fio error {job['error']}")
        side = job["write"] if job["write"]["io_bytes"] > job["read"]["io_bytes"] else job["read"]
        value = side["bw_bytes"] / 1e6 if a.metric == "mb_per_s" else side["iops"]
        if a.window == "job":
            fields["runtime_s"] = rounded(job["job_runtime"] / 1000.0)
        pct = side["clat_ns"].get("percentile", {})
        line["value"] = rounded(value, 4)
        line["client_cpu_s"] = rounded(
            (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * job["job_runtime"] / 1000.0)
        line["lat_p50_us"] = rounded(pct.get("50.000000", 0) / 1000.0)
        line["lat_p99_us"] = rounded(pct.get("99.000000", 0) / 1000.0)
        # fsync / fdatasync calls (--fsync, --fdatasync): their own latency, apart from the
        # writes' completion latency above.
        # (fio 3.33 leaves sync.total_ios at 0; lat_ns.N counts them.)
        sync = job.get("sync", {}).get("lat_ns", {})
        if sync.get("N"):
            spct = sync.get("percentile", {})
            line["syncs"] = sync["N"]
            line["sync_p50_us"] = rounded(spct.get("50.000000", 0) / 1000.0)
            line["sync_p99_us"] = rounded(spct.get("99.000000", 0) / 1000.0)
    except (OSError, ValueError, KeyError, IndexError) as e:
        line["error"] = (a.error or str(e))[:300]
    line["io"] = a.io
    line.update(fields)
    line.update(json.loads(a.fs_fields))
    line["cpu_us_per_unit"] = rounded(
        cpu_per_unit_us(line["cpu_s"], line["value"], fields.get("runtime_s")))
    emit(line)


def cmd_meta(a):
    seen = 0
    for raw in sys.stdin:
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        m = json.loads(raw)
        seen += 1
        op = m["op"]
        workload = op if op.startswith("smallfile") else f"meta_{m['layout']}_{op}"
        emit({"bench": "fs", "fs": a.fs, "workload": workload, "metric": "ops_per_s",
              "value": rounded(m["ops_per_s"], 4), "cpu_s": m["daemon_cpu_s"],
              "client_cpu_s": m["client_cpu_s"], "files": m["files"], "ops": m["ops"],
              "seconds": m["seconds"],
              "cpu_us_per_unit": rounded(cpu_per_unit_us(m["daemon_cpu_s"], m["ops_per_s"],
                                                         m["seconds"])),
              **json.loads(a.fields)})
    if a.error:
        emit({"bench": "fs", "fs": a.fs, "workload": f"meta_{a.layout}", "metric": "ops_per_s",
              "value": None, "cpu_s": None, "error": a.error, "phases_done": seen,
              **json.loads(a.fields)})


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip().startswith("{")]


def median(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def rounds_by_key(lines):
    """{(fs, workload): [line, ...]} of the measured lines (no ratios, no info): one a round."""
    out = {}
    for l in lines:
        if "fs" in l and "workload" in l and "ratio" not in l:
            out.setdefault((l["fs"], l["workload"]), []).append(l)
    return out


def results_by_key(lines):
    """{(fs, workload): line}; a workload measured in several rounds as one line: the last
    round's, with the median of the rounds' value and CPU cost, and "values" (each round's)."""
    out = {}
    for k, ls in rounds_by_key(lines).items():
        if len(ls) == 1:
            out[k] = ls[0]
            continue
        m = dict(ls[-1])
        m.pop("round", None)
        values = [l.get("value") for l in ls]
        m["value"] = median([v for v in values if v])
        m["cpu_us_per_unit"] = median([l["cpu_us_per_unit"] for l in ls
                                       if l.get("cpu_us_per_unit")])
        m["values"] = values
        out[k] = m
    return out


def paired_ratio(by_key, num, den, w, key="value"):
    """(median, [each round's]) of num/den on workload w over the rounds that measured both
    (by_key: rounds_by_key); (None, []) where none did. A run without rounds: its one ratio."""
    den_of = {l.get("round"): l for l in by_key.get((den, w), [])}
    rs = []
    for x in by_key.get((num, w), []):
        y = den_of.get(x.get("round"))
        if y and x.get(key) and y.get(key):
            rs.append(x[key] / y[key])
    return median(rs), rs


def workloads_in_order(lines):
    seen = []
    for l in lines:
        w = l.get("workload")
        if "fs" in l and w and w != "idle" and "ratio" not in l and w not in seen:
            seen.append(w)
    return seen


def group_of(workload):
    if workload.startswith("durable_"):
        return "durability"
    if workload.endswith("_buffered"):
        return "fio_buffered"
    if workload.endswith("_direct"):
        return "fio_direct"
    return "meta"


def cmd_ratios(a):
    lines = load(a.results)
    by_key = rounds_by_key(lines)
    workloads = workloads_in_order(lines)
    for num, den in RATIO_PAIRS:
        logs = {}
        for w in workloads:
            r, rs = paired_ratio(by_key, num, den, w)
            if r is None:
                continue
            cpu, _ = paired_ratio(by_key, num, den, w, "cpu_us_per_unit")
            line = {"bench": "fs", "ratio": f"{num}/{den}", "workload": w,
                    "metric": by_key[(num, w)][0]["metric"], "value": rounded(r),
                    "cpu_per_unit_ratio": rounded(cpu)}
            if len(rs) > 1:
                line["rounds"] = [rounded(x) for x in rs]
            emit(line)
            logs.setdefault(group_of(w), []).append(math.log(r))
        for g, v in logs.items():
            emit({"bench": "fs", "ratio": f"{num}/{den}", "workload": f"geomean_{g}",
                  "metric": "ratio", "value": rounded(math.exp(sum(v) / len(v))), "n": len(v)})


def gnuplot_histogram(png, title, ylabel, rows, columns, panels=None, size="1400,650"):
    """Clustered bars, log y. rows: [(label, [value or None per column])]. panels: a list of
    (title, ylabel, rows) drawn side by side instead."""
    panels = panels or [(title, ylabel, rows)]
    script = [f"set terminal pngcairo size {size} noenhanced font ',10'",
              f"set output '{png}'",
              "set style data histograms", "set style histogram clustered gap 1",
              "set style fill solid 0.85 border -1", "set boxwidth 0.9",
              "set logscale y", "set datafile missing 'NaN'", "set grid ytics",
              "set xtics rotate by -35 left", "set key top right",
              "set bmargin 9"]
    if len(panels) > 1:
        script.append(f"set multiplot layout 1,{len(panels)}")
    tmp = []
    for ptitle, plabel, prows in panels:
        fd, path = tempfile.mkstemp(suffix=".dat")
        tmp.append(path)
        with os.fdopen(fd, "w") as f:
            for label, vals in prows:
                f.write(label + " " + " ".join(
                    "NaN" if v is None or v <= 0 else repr(v) for v in vals) + "\n")
        if not prows:
            continue
        script.append(f"set title '{ptitle}'")
        script.append(f"set ylabel '{plabel}'")
        plots = [f"'{path}' using {i + 2}:xtic(1) title '{c}'" if i == 0 else
                 f"'' using {i + 2} title '{c}'" for i, c in enumerate(columns)]
        script.append("plot " + ", ".join(plots))
    if len(panels) > 1:
        script.append("unset multiplot")
    try:
        subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    finally:
        for p in tmp:
            os.unlink(p)
    print(png)


def cmd_charts(a):
    lines = load(a.results)
    res = results_by_key(lines)
    present = {l["fs"] for l in lines if "fs" in l}
    fses = [f for f in FS_ORDER if f in present]
    workloads = workloads_in_order(lines)

    def rows(ws, key="value", fs_list=None):
        fs_list = fs_list or fses
        return [(w, [(res.get((f, w)) or {}).get(key) for f in fs_list]) for w in ws]

    def measured(ws):
        """The filesystems with a result for one of ws (a chart's columns)."""
        return [f for f in fses if any((res.get((f, w)) or {}).get("value") for w in ws)]

    info = next((l["info"] for l in lines if "info" in l), {})
    note = f"{info.get('host', '')}, {info.get('nproc', '?')} cores, file {info.get('file_mb', '?')} MiB"
    for io in ("buffered", "direct"):
        ws = [w for w in workloads if w.endswith("_" + io)]
        seq = [w for w in ws if w.startswith("seq")]
        rnd = [w for w in ws if w.startswith("rand")]
        cols = measured(ws)
        if not cols:
            continue
        gnuplot_histogram(f"{a.stem}-fio-{io}.png", "", "", [], cols, panels=[
            (f"fio sequential 1 MiB, {io} ({note})", "MB/s", rows(seq, fs_list=cols)),
            (f"fio random 4 KiB, 2 jobs, {io}", "IOPS", rows(rnd, fs_list=cols))])
    dur = [w for w in workloads if group_of(w) == "durability"]
    cols = measured(dur)
    if cols:
        gnuplot_histogram(f"{a.stem}-durability.png", "", "", [], cols, panels=[
            (f"4 KiB random writes, fdatasync each ({note})", "IOPS",
             rows([w for w in dur if "randwrite" in w], fs_list=cols)),
            ("1 MiB appends, fsync every 16", "MB/s",
             rows([w for w in dur if "append" in w], fs_list=cols))])
    meta = [w for w in workloads if group_of(w) == "meta"]
    if measured(meta):
        gnuplot_histogram(f"{a.stem}-meta.png", f"metadata and small files ({note})", "ops/s",
                          rows(meta, fs_list=measured(meta)), measured(meta))
    # Ratios: above 1, warpfs is faster (the comparisons of the run's filesystems).
    pairs = [p for p in RATIO_PAIRS if p[0] in fses and p[1] in fses][:5]
    by_key = rounds_by_key(lines)
    ratio_rows = [(w, [paired_ratio(by_key, num, den, w)[0] for num, den in pairs])
                  for w in workloads]
    if pairs:
        gnuplot_histogram(f"{a.stem}-ratios.png", f"throughput ratios (>1: first is faster; {note})",
                          "ratio", ratio_rows, [f"{n}/{d}" for n, d in pairs], size="1800,700")
    daemons = [f for f in fses if f not in ("tmpfs", "ext4_loop")]
    gnuplot_histogram(f"{a.stem}-cpu.png",
                      f"daemon CPU per op (random, metadata) or per MB (sequential) ({note})",
                      "daemon CPU us per unit", rows(workloads, "cpu_us_per_unit", daemons),
                      daemons, size="1800,700")


def cmd_table(a):
    lines = load(a.results)
    res = results_by_key(lines)
    present = {l["fs"] for l in lines if "fs" in l}
    fses = [f for f in FS_ORDER if f in present]
    pairs = ([p for p in TABLE_PAIRS if p[0] in fses and p[1] in fses] or
             [p for p in RATIO_PAIRS if p[0] in fses and p[1] in fses][:4])

    def fmt(x):
        if x is None:
            return "-"
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"

    print("| workload | metric | " + " | ".join(fses + [f"{n}/{d}" for n, d in pairs]) + " |")
    print("|---" * (2 + len(fses) + len(pairs)) + "|")
    idle = [(f, res.get((f, "idle"))) for f in fses]
    if any(l for _, l in idle):
        print("| idle | cpu_percent | " + " | ".join(fmt(l["value"]) if l else "-" for _, l in idle) +
              " |" + " |" * len(pairs))
    by_key = rounds_by_key(lines)
    for w in workloads_in_order(lines):
        metric = next(res[(f, w)]["metric"] for f in fses if (f, w) in res)
        vals = [(res.get((f, w)) or {}).get("value") for f in fses]
        ratios = [paired_ratio(by_key, n, d, w)[0] for n, d in pairs]
        print(f"| {w} | {metric} | " + " | ".join(fmt(v) for v in vals + ratios) + " |")
    geo = [l for l in lines if "ratio" in l and l["workload"].startswith("geomean")]
    for l in geo:
        print(f"| {l['workload']} ({l['n']}) | {l['ratio']} | {fmt(l['value'])} |")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("info")
    s.add_argument("--fields", required=True)
    s.add_argument("--key", default="info")
    s = sub.add_parser("idle")
    s.add_argument("--fs", required=True)
    s.add_argument("--idle-s", type=float, required=True)
    s.add_argument("--ticks", required=True)
    s.add_argument("--tck", type=float, required=True)
    s.add_argument("--ctx", type=int, required=True)
    s.add_argument("--fields", default="{}")
    s = sub.add_parser("fio")
    for k in ("--fs", "--workload", "--io", "--metric", "--ticks", "--json", "--fields"):
        s.add_argument(k, required=True)
    s.add_argument("--tck", type=float, required=True)
    s.add_argument("--error", default="")
    s.add_argument("--fs-fields", default="{}")
    s.add_argument("--window", choices=("measured", "job"), default="measured")
    s = sub.add_parser("meta")
    s.add_argument("--fs", required=True)
    s.add_argument("--layout", required=True)
    s.add_argument("--error", default="")
    s.add_argument("--fields", default="{}")
    s = sub.add_parser("ratios")
    s.add_argument("results")
    s = sub.add_parser("charts")
    s.add_argument("results")
    s.add_argument("stem")
    s = sub.add_parser("table")
    s.add_argument("results")
    a = p.parse_args()
    {"info": cmd_info, "idle": cmd_idle, "fio": cmd_fio, "meta": cmd_meta,
     "ratios": cmd_ratios, "charts": cmd_charts, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
